"""What the runner needs from a task family: problems, a per-node verifier and a problem score.

A problem comes with a natural-language statement for the planner and, where the dataset has one,
a gold subtask graph (SciCode's sub-steps, one node for HumanEval). The runner executes a graph's
nodes; after each node the family's `score_node` says how good the artifact is (the step reward
u_i in [0, 1]) and whether it may flow downstream (`passed`); `score_problem` scores the
finished task from the artifacts of its nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class Problem:
  id: str
  family: str  # "humaneval", "scicode", "srdd", "synthetic"
  category: str  # for out-of-distribution splits
  statement: str  # what the planner reads
  gold_graph: Sequence[Mapping[str, Any]] | None = None  # [{id, title, description, depends_on}]
  data: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # family-specific


@dataclasses.dataclass(frozen=True)
class NodeScore:
  reward: float  # the step reward u_i in [0, 1]
  passed: bool  # False: the artifact is blocked from flowing downstream
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ProblemScore:
  passed: bool
  metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


class TaskFamily(Protocol):
  name: str

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    """What the executor must produce for this node (e.g. the function header to implement).

    A family may also define `reply_prefix(problem, node) -> str`: text the executor's reply
    starts with, appended to the prompt and put back in front of the reply before scoring
    (runner.reply_prefix)."""

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    """Verify one node's artifact; `upstream` maps passed ancestor node ids to their artifacts."""

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    """Score the finished task; blocked nodes have artifact None."""


def null_baseline(expected: Sequence[Any], inputs: Sequence[Any] | None = None,
                  same: Callable[[Any, Any], bool] = lambda a, b: bool(a == b)) -> int:
  """The most tests one answer that ignores its input passes: a constant (the largest group of
  tests whose expected values are `same`) or, with `inputs` (one per expected value, None where
  unknown), the input returned unchanged."""
  constant = max((sum(1 for z in expected if same(z, y)) for y in expected), default=0)
  identity = sum(1 for x, y in zip(inputs or (), expected, strict=False)
                 if x is not None and same(x, y))
  return max(constant, identity)


def reward_above_null(passed: int, total: int, baseline: int) -> float:
  """A step reward from unit tests that an answer computing nothing cannot earn: the share of
  the tests beyond `baseline` (the most such an answer passes, measured: `tasks.nulls`) that the
  program passed, (passed - baseline) / (total - baseline), at least 0; 0 when the tests cannot
  tell a solution from such an answer (baseline >= total: a single test a constant passes, as
  HumanEval/34's one assert)."""
  if total <= baseline:
    return 0.0
  return max(0.0, (passed - baseline) / (total - baseline))
