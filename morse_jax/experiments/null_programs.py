"""Replies that compute nothing, and how each task family scores them: no reward may come of them.

The null programs are `tasks.nulls`': generic bodies (a constant, an empty container, empty numpy
arrays, the first input unchanged, raise, exit at import or in the call, sleep past the limit) and
each node's own (each target of its tests as a constant, zeros / ones like each target, each
parent's result unchanged: `node_nulls`). For SRDD, whose replies are scripts, the generic bodies
sit in a `main()` the script calls.

`score(family, problem, node_id, null, body)` scores one null reply on one node the way a run
would: after the gold (or reference) code of the node's upstream steps, so only the null step is
wrong. `benchmarks.null_sweep` sweeps every problem of every family;
tests/experiments/test_null_programs.py samples it.
"""

from __future__ import annotations

from typing import Any

from morse_jax.tasks import humaneval, nulls, scicode, srdd, synthetic
from morse_jax.tasks.base import Problem

NAMES = nulls.NAMES
function, reply, script = nulls.function, nulls.reply, nulls.script


def _scicode_upstream(problem: Problem, node_id: str) -> dict[str, str]:
  out = {}
  for node in problem.gold_graph:
    if node["id"] == node_id:
      return out
    out[node["id"]] = scicode.gold_artifact(problem, node["id"])
  raise ValueError(f"scicode problem {problem.id}: no step {node_id!r}")


def _synthetic_upstream(problem: Problem, node_id: str) -> dict[str, str]:
  nodes = {n["id"]: n for n in problem.gold_graph}
  seen, stack = set(), list(nodes[node_id]["depends_on"])
  while stack:
    u = stack.pop()
    if u not in seen:
      seen.add(u)
      stack.extend(nodes[u]["depends_on"])
  return {u: synthetic.reference_artifact(problem, u) for u in sorted(seen, key=int)}


def nodes(problem: Problem) -> list[str]:
  """The node ids a sweep scores: every step of the gold graph (SRDD: one node)."""
  return [n["id"] for n in problem.gold_graph] if problem.gold_graph else ["1"]


def node_nulls(family: Any, problem: Problem, node_id: str) -> dict[str, str | None]:
  """Every null program swept on a node, name -> body: the generic ones (`NAMES`, body None)
  and the node's own (`null_bodies` of its family, those that are not generic; SRDD has none)."""
  generic: dict[str, str | None] = {name: None for name in NAMES}
  if isinstance(family, humaneval.HumanEval):
    own = family.null_bodies(problem)
  elif isinstance(family, scicode.SciCode):
    own = family.null_bodies(problem, scicode.sub_step(problem, node_id))
  elif isinstance(family, synthetic.Synthetic):
    own = synthetic.null_bodies(problem, node_id)
  else:
    own = {}
  return {**generic, **{k: v for k, v in own.items() if k not in generic}}


def score(family: Any, problem: Problem, node_id: str, null: str, body: str | None = None) -> float:
  """The reward `family` gives a null reply on node `node_id` of `problem`: the generic `null`
  (one of `NAMES`), or with `body` a node's own (`node_nulls`; `null` then only names it)."""
  node = next((n for n in problem.gold_graph or () if n["id"] == node_id),
              {"id": node_id, "title": "main", "description": "the program"})
  null = None if body is not None else null
  if isinstance(family, humaneval.HumanEval):
    text, upstream = reply(problem.data["entry_point"], null, body=body), {}
  elif isinstance(family, scicode.SciCode):
    text, upstream = reply(node["title"], null, body=body), _scicode_upstream(problem, node_id)
  elif isinstance(family, synthetic.Synthetic):
    text = reply(problem.data["nodes"][node_id]["function"], null, body=body)
    upstream = _synthetic_upstream(problem, node_id)
  elif isinstance(family, srdd.SRDD):
    text, upstream = script(null, body=body), {}
  else:
    raise TypeError(f"null_programs.score: family {type(family).__name__} is not swept")
  return family.score_node(problem, node, text, upstream).reward
