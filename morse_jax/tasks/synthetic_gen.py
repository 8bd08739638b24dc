"""Procedural generation of one synthetic task: a graph shape, one op per node, tests.

Every function of a task takes the task's input (`xs: list[int]` or `s: str`); a node that
depends on earlier nodes calls their functions on that input and combines the results with its
op. So a node's unit tests need its ancestors' code, and a missing (blocked) ancestor shows up as
a NameError, not as a crash of the verifier.

Shapes (node ids "1".."n" in topological order):
  chain      1 -> 2 -> ... -> n, 2 <= n <= 6;
  diamond    a shared prefix (1-2 nodes), two branches (1-2 nodes each) from its end, a merge
             node with the two branch ends as parents, and an optional suffix node; 4-6 nodes;
  fork_join  as diamond without the prefix: both branches start from the input; 3-6 nodes.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any, Sequence

from morse_jax.tasks import synthetic_list_ops, synthetic_str_ops
from morse_jax.tasks.base import Problem
from morse_jax.tasks.synthetic_ops import (ANNOTATION, ARG, DESCRIBE_INPUT, EMPTY, Op,
                                           random_value)

FAMILY = "synthetic"
OPS: tuple[Op, ...] = (synthetic_list_ops.FILTER + synthetic_list_ops.MATH
                       + synthetic_list_ops.ORDER + synthetic_list_ops.NUMBER
                       + synthetic_str_ops.TRANSFORM + synthetic_str_ops.ANALYSIS)
BY_KEY = {op.key: op for op in OPS}
CATEGORIES: tuple[str, ...] = tuple(dict.fromkeys(op.category for op in OPS))
SHAPES = ("chain", "diamond", "fork_join")
UNIT_TESTS = 6  # per node: the empty input, then random ones
_REDRAWS = 50  # draws (from the node's own stream) for a random test that gives its answer away
HIDDEN_TESTS = 10  # for the final function: the empty input, then random ones
_ATTEMPTS = 300
_THEME_WEIGHT = 4.0  # ops of the task's theme category are this much likelier
_MAX_REPR = 200
# An int early in a task leaves only number ops for the rest of its chain; make that rarer, so
# that most tasks stay on lists and strings and end with an aggregate.
_EARLY_INT_WEIGHT = 0.25

assert len(BY_KEY) == len(OPS), "duplicate op keys"


@dataclasses.dataclass(frozen=True)
class _Node:
  op: Op
  k: int | None
  parents: tuple[int, ...]  # node indices, in the op's input order (a, then b)


def sample_shape(rng: random.Random, steps: int = 0) -> tuple[str, list[tuple[int, ...]]]:
  """(kind, parents of each node as indices, in topological order). steps > 0: a chain of
  exactly that many nodes (the easy tiers); 0: the suite's shapes."""
  if steps:
    return "chain", [()] + [(i - 1,) for i in range(1, steps)]
  kind = rng.choices(SHAPES, weights=(4, 4, 2))[0]
  if kind == "chain":
    return kind, [()] + [(i - 1,) for i in range(1, rng.randint(2, 6))]
  while True:
    prefix = 0 if kind == "fork_join" else rng.randint(1, 2)
    la, lb, suffix = rng.randint(1, 2), rng.randint(1, 2), rng.randint(0, 1)
    if prefix + la + lb + 1 + suffix <= 6:
      break
  parents: list[tuple[int, ...]] = [((i - 1,) if i else ()) for i in range(prefix)]
  source = (prefix - 1,) if prefix else ()
  ends = []
  for length in (la, lb):
    for j in range(length):
      parents.append(source if j == 0 else (len(parents) - 1,))
    ends.append(len(parents) - 1)
  parents.append(tuple(ends))
  parents += [(len(parents) - 1 + j,) for j in range(suffix)]
  return kind, parents


def _candidates(pool: Sequence[Op], in_types: list[str], parents: tuple[int, ...],
                nodes: list[_Node]) -> list[tuple[Op, tuple[int, ...]]]:
  out = []
  for op in pool:
    if op.arity != len(in_types):
      continue
    if list(op.inputs) == in_types:
      order = parents
    elif op.arity == 2 and list(op.inputs) == in_types[::-1]:
      order = parents[::-1]
    else:
      continue
    if op.arity == 1 and parents and nodes[parents[0]].op.key == op.key:
      continue  # sort after sort, double after double: a wasted step
    out.append((op, order))
  return out


def _assign(shape: list[tuple[int, ...]], input_type: str, theme: str, pool: Sequence[Op],
            rng: random.Random) -> list[_Node] | None:
  nodes: list[_Node] = []
  inner = {p for parents in shape for p in parents}
  for i, parents in enumerate(shape):
    in_types = [nodes[p].op.output for p in parents] if parents else [input_type]
    cands = _candidates(pool, in_types, parents, nodes)
    if not cands:
      return None
    weights = [(_THEME_WEIGHT if op.category == theme else 1.0)
               * (_EARLY_INT_WEIGHT if i in inner and op.output == "int" != in_types[0]
                  and theme != "number_math" else 1.0)
               for op, _ in cands]
    op, order = rng.choices(cands, weights=weights)[0]
    nodes.append(_Node(op, rng.choice(op.ks) if op.ks else None, tuple(order)))
  return nodes


def _signature(nodes: list[_Node], i: int) -> tuple:
  node = nodes[i]
  return (node.op.key, node.k, tuple(_signature(nodes, p) for p in node.parents))


def _evaluate(nodes: list[_Node], x: Any) -> list[Any]:
  values: list[Any] = []
  for node in nodes:
    args = [values[p] for p in node.parents] if node.parents else [x]
    values.append(node.op(node.k, *args))
  return values


def _names(nodes: list[_Node]) -> list[str]:
  names: list[str] = []
  for node in nodes:
    base = node.op.function_name(node.k)
    name, n = base, 1
    while name in names:
      n += 1
      name = f"{base}_{n}"
    names.append(name)
  return names


def _dominant(nodes: list[_Node]) -> str:
  """The most frequent category; on a tie the final node's, else the earliest node's."""
  counts = collections.Counter(n.op.category for n in nodes)
  best = max(counts.values())
  tied = [n.op.category for n in nodes if counts[n.op.category] == best]
  return nodes[-1].op.category if nodes[-1].op.category in tied else tied[0]


def _ancestors(nodes: list[_Node], i: int) -> set[int]:
  out, stack = set(), list(nodes[i].parents)
  while stack:
    p = stack.pop()
    if p not in out:
      out.add(p)
      stack.extend(nodes[p].parents)
  return out


def _telling(nodes: list[_Node], i: int, inputs: list[Any], input_type: str,
             rng: random.Random) -> list[Any]:
  """`inputs` with each random one (after the first, the empty input) whose answer a null
  program gives (the input itself, or an ancestor's result on it: the cheapest programs, as the
  prompt names the ancestors) replaced by a draw from `rng` that gives nothing away, where one of
  `_REDRAWS` draws does. `rng` is the node's own stream: the suite's stream, and so every other
  part of the problem, stays as it was. A node whose answer no tried input keeps apart from the
  given ones (an op that changes nothing after its ancestors: last digit of a digit count) keeps
  the suite's draws; its measured null baseline is all of its tests, so it earns no reward of
  its own (`Synthetic.null_baseline`)."""
  ancestors = _ancestors(nodes, i)

  def gives_away(x: Any) -> bool:
    values = _evaluate(nodes, x)
    return repr(values[i]) in {repr(x)} | {repr(values[a]) for a in ancestors}
  out = inputs[:1]
  for x in inputs[1:]:
    draw = x
    for _ in range(_REDRAWS):
      if not gives_away(draw):
        break
      draw = random_value(input_type, rng)
    out.append(draw if not gives_away(draw) else x)
  return out


def _tests(name: str, inputs: list[Any], outputs: list[Any]) -> list[str] | None:
  tests = [f"assert {name}({x!r}) == {y!r}" for x, y in zip(inputs, outputs)]
  if any(len(repr(x)) > _MAX_REPR or len(repr(y)) > _MAX_REPR for x, y in zip(inputs, outputs)):
    return None
  return tests


def _node_text(node: _Node, names: list[str], i: int, arg: str, input_type: str) -> dict:
  """The node's signature, description and reference source."""
  op, name = node.op, names[i]
  header = f"def {name}({arg}: {ANNOTATION[input_type]}) -> {ANNOTATION[op.output]}"
  calls = [names[p] for p in node.parents]
  if not calls:
    lets, lines = f"Its argument `{arg}` is {DESCRIBE_INPUT[input_type]}. ", []
    doc, body = op.describe(node.k, arg), op.body(node.k, arg)
  else:
    variables = ("a", "b")[:len(calls)]
    lines = [f"{v} = {c}({arg})" for v, c in zip(variables, calls)]
    assigned = " and ".join(f"`{line}`" for line in lines)
    named = " and ".join(f"`{c}`" for c in calls)
    which = ("is the function of an earlier step (call it; do not reimplement it)"
             if len(calls) == 1 else
             "are the functions of earlier steps (call them; do not reimplement them)")
    lets = f"Let {assigned}, where {named} {which}. "
    doc, body = op.describe(node.k, *variables), op.body(node.k, *variables)
  source = "\n".join([header + ":"] + [f"    {line}" for line in lines + body]) + "\n"
  return {"function": name, "signature": header + ":", "reference": source, "calls": calls,
          "op": op.key, "category": op.category, "k": node.k,
          "description": f"Write `{header}`. {lets}Return {doc}."}


def _statement(nodes: list[_Node], arg: str, input_type: str, header: str) -> str:
  """The goal in English: intermediate values A, B, ... but no subtask functions."""
  letters = [chr(ord("A") + i) for i in range(len(nodes))]
  lines = [f"Write a Python function `{header}`. Its argument `{arg}` is "
           f"{DESCRIBE_INPUT[input_type]}."]
  for i, node in enumerate(nodes):
    args = [letters[p] for p in node.parents] if node.parents else [arg]
    doc = node.op.describe(node.k, *args)
    lines.append(f"Let `{letters[i]}` be {doc}." if i < len(nodes) - 1 else
                 f"The function returns {doc}.")
  return "\n".join(lines)


def _try_build(pid: str, rng: random.Random, pool: Sequence[Op],
               steps: int = 0) -> Problem | None:
  kind, shape = sample_shape(rng, steps)
  theme = rng.choice(sorted({op.category for op in pool}))
  roots = {op.inputs[0] for op in pool if op.arity == 1 and op.inputs[0] in ARG}
  preferred = "str" if theme.startswith("string") else "list"
  if not roots:
    return None
  input_type = preferred if preferred in roots else sorted(roots)[0]
  nodes = _assign(shape, input_type, theme, pool, rng)
  if nodes is None:
    return None
  merges = [i for i, n in enumerate(nodes) if len(n.parents) == 2]
  if any(_signature(nodes, nodes[i].parents[0]) == _signature(nodes, nodes[i].parents[1])
         for i in merges):
    return None  # both branches compute the same value
  names, arg = _names(nodes), ARG[input_type]
  spec: dict[str, dict] = {}
  for i, node in enumerate(nodes):
    inputs = [EMPTY[input_type]] + [random_value(input_type, rng) for _ in range(UNIT_TESTS - 1)]
    inputs = _telling(nodes, i, inputs, input_type, random.Random(f"{pid}/tests/{i}"))
    outputs = [_evaluate(nodes, x)[i] for x in inputs]
    tests = _tests(names[i], inputs, outputs)
    if tests is None or len({repr(y) for y in outputs}) < 2:
      return None  # a node whose tests a constant would pass
    spec[str(i + 1)] = {**_node_text(node, names, i, arg, input_type), "tests": tests}
  inputs = [EMPTY[input_type]] + [random_value(input_type, rng) for _ in range(HIDDEN_TESTS - 1)]
  outputs = [_evaluate(nodes, x)[-1] for x in inputs]
  hidden = _tests(names[-1], inputs, outputs)
  if hidden is None or len({repr(y) for y in outputs}) < 3:
    return None
  final = str(len(nodes))
  graph = [{"id": i, "title": s["function"], "description": s["description"],
            "depends_on": [str(p + 1) for p in sorted(nodes[int(i) - 1].parents)]}
           for i, s in spec.items()]
  data = {"input_type": input_type, "arg": arg, "shape": kind, "final": final,
          "entry_point": names[-1], "nodes": spec, "hidden_tests": hidden,
          "categories": sorted({n.op.category for n in nodes})}
  statement = _statement(nodes, arg, input_type, spec[final]["signature"][len("def "):-1])
  return Problem(id=pid, family=FAMILY, category=_dominant(nodes), statement=statement,
                 gold_graph=graph, data=data)


def build(seed: int, index: int, categories: Sequence[str] | None = None,
          steps: int = 0) -> Problem:
  """Problem `index` of the suite with this seed; the same arguments give the same problem.
  steps > 0 builds the easy tier of chains of exactly `steps` nodes instead (its own ids and
  random stream: "synthetic/chain1/<seed>/<index>"); 0 the suite's 2-6-node shapes."""
  if not 0 <= steps <= 6:
    raise ValueError(f"synthetic: steps={steps!r} must be 0 (the suite's shapes) or 1-6")
  pool = [op for op in OPS if categories is None or op.category in categories]
  pid = f"{FAMILY}/chain{steps}/{seed}/{index}" if steps else f"{FAMILY}/{seed}/{index}"
  rng = random.Random(pid)
  for _ in range(_ATTEMPTS):
    problem = _try_build(pid, rng, pool, steps)
    if problem is not None:
      return problem
  raise ValueError(f"synthetic: could not build a task of {steps or '2-6'} steps from categories "
                   f"{sorted(set(categories or CATEGORIES))} in {_ATTEMPTS} attempts; they need "
                   "ops that take the output of the first step (e.g. add a list category)")
