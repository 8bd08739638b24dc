"""Replies that compute nothing, and how each task family scores them: no reward may come of them.

A null program defines the function a task asks for (any signature: `*args, **kwargs`) with a
body that does no work: it returns a constant, an empty container, empty numpy arrays of 1-7
dimensions (shape (0, 1, ..., 1)) or a tuple of them, its first input unchanged, raises, exits
(at import or in the call) or sleeps past the time limit. For SRDD, whose replies are scripts,
the same bodies sit in a `main()` the script calls.

`score(family, problem, node_id, null)` scores one null reply on one node the way a run would:
after the gold (or reference) code of the node's upstream steps, so only the null step is wrong.
`benchmarks.null_sweep` sweeps every problem of every family;
tests/experiments/test_null_programs.py samples it.
"""

from __future__ import annotations

import textwrap
from typing import Any

from morse_jax.tasks import humaneval, scicode, srdd, synthetic
from morse_jax.tasks.base import Problem

_EMPTY = "__import__('numpy').empty({shape})"


def _empty(dims: int) -> str:
  return _EMPTY.format(shape=(0,) + (1,) * (dims - 1))


# name -> the function's body (4-space indented source, may use `args`).
BODIES: dict[str, str] = {
    "return 0": "return 0",
    "return 0.0": "return 0.0",
    "return 1": "return 1",
    "return True": "return True",
    "return 'a'": "return 'a'",
    "return None": "return None",
    "return []": "return []",
    "return {}": "return {}",
    "return ''": "return ''",
    "return ()": "return ()",
    **{f"return empty {d}-d array": f"return {_empty(d)}" for d in range(1, 8)},
    **{f"return {k} empty arrays": "return (" + ", ".join([_empty(7)] * k) + ",)"
       for k in (2, 3)},
    "return the first input": "return args[0] if args else None",
    "raise": "raise ValueError('nothing computed')",
    "exit(0) in the call": "exit(0)",
    "os._exit(0) in the call": "__import__('os')._exit(0)",
    "sleep past the limit": "__import__('time').sleep(10 ** 6)",
}
# name -> a module-level statement placed before a function that returns 0.
AT_IMPORT: dict[str, str] = {
    "exit(0) at import": "exit(0)",
    "os._exit(0) at import": "__import__('os')._exit(0)",
}
NAMES: tuple[str, ...] = (*BODIES, *AT_IMPORT)


def function(name: str, null: str) -> str:
  """The code of a null program defining `name`."""
  if null in AT_IMPORT:
    return f"{AT_IMPORT[null]}\n\ndef {name}(*args, **kwargs):\n    return 0\n"
  if null not in BODIES:
    raise ValueError(f"null_programs: null={null!r}; expected one of {list(NAMES)}")
  return f"def {name}(*args, **kwargs):\n{textwrap.indent(BODIES[null], '    ')}\n"


def reply(name: str, null: str) -> str:
  """A null program as an executor's reply (one ```python block)."""
  return f"```python\n{function(name, null)}```\n"


def script(null: str) -> str:
  """A null SRDD program: the null body in `main()`, which the script calls."""
  return reply("main", null).replace("```\n", "\nif __name__ == '__main__':\n    main()\n```\n")


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


def score(family: Any, problem: Problem, node_id: str, null: str) -> float:
  """The reward `family` gives the null reply `null` on node `node_id` of `problem`."""
  node = next((n for n in problem.gold_graph or () if n["id"] == node_id),
              {"id": node_id, "title": "main", "description": "the program"})
  if isinstance(family, humaneval.HumanEval):
    text, upstream = reply(problem.data["entry_point"], null), {}
  elif isinstance(family, scicode.SciCode):
    text, upstream = reply(node["title"], null), _scicode_upstream(problem, node_id)
  elif isinstance(family, synthetic.Synthetic):
    text = reply(problem.data["nodes"][node_id]["function"], null)
    upstream = _synthetic_upstream(problem, node_id)
  elif isinstance(family, srdd.SRDD):
    text, upstream = script(null), {}
  else:
    raise TypeError(f"null_programs.score: family {type(family).__name__} is not swept")
  return family.score_node(problem, node, text, upstream).reward
