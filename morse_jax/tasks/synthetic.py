"""A procedurally generated suite of multi-step programming tasks on integer lists and strings.

Each task asks for one Python function, described in English (`Problem.statement`); its gold
graph splits it into 2-6 subtasks, one function each, shaped as a chain, a diamond or a fork-join
(see synthetic_gen). A subtask function calls the functions of its parent subtasks by name, so the
suite trains and demos MoRSE's graph execution on a CPU: the verifier is cheap, exact and never
needs a model.

  generate(n, seed, categories=None, steps=0)   n problems, deterministic by seed; `categories`
                                      limits the subtask types drawn (e.g. the train
                                      categories); steps=N > 0: the easy tier, chains of N
  split(problems, which, holdout)     out-of-distribution split by whole categories
  instance_split(problems, which, categories, test_problems)   disjoint problems of categories
  reference_artifact(problem, id)     a perfect executor's reply for one node
  Synthetic()                         the TaskFamily

Per node, `problem.data["nodes"][id]` holds function, signature, description, reference (source),
tests (assert strings made by the op's reference callable on inputs drawn from the seed), calls,
op, category and k; `data["hidden_tests"]` tests the final function (`data["entry_point"]`).
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
from typing import Any, Mapping, Sequence

from morse_jax.execution import verifier
from morse_jax.tasks import synthetic_gen
from morse_jax.tasks import base
from morse_jax.tasks import nulls
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore

FAMILY = synthetic_gen.FAMILY
CATEGORIES = synthetic_gen.CATEGORIES
SHAPES = synthetic_gen.SHAPES
DEFAULT_HOLDOUT = ("string_analysis",)
_FOOTER = ("Reply with the complete function in one ```python code block, with no placeholders "
           "(`pass`, TODO) and no test code.")


def subtask_types() -> dict[str, str]:
  """Subtask type (op key) -> its category."""
  return {op.key: op.category for op in synthetic_gen.OPS}


def _check_categories(categories: Sequence[str], what: str) -> tuple[str, ...]:
  if isinstance(categories, str):
    categories = (categories,)
  unknown = sorted(set(categories) - set(CATEGORIES))
  if unknown:
    raise ValueError(f"synthetic: unknown {what} {unknown}; the categories are {list(CATEGORIES)}")
  return tuple(categories)


def train_categories(holdout: Sequence[str] = DEFAULT_HOLDOUT) -> tuple[str, ...]:
  """The categories left after holding some out: `generate(n, seed, train_categories(h))` makes
  a training set without any subtask of the held-out categories."""
  held = _check_categories(holdout, "holdout category")
  return tuple(c for c in CATEGORIES if c not in held)


def generate(n: int, seed: int, categories: Sequence[str] | None = None,
             steps: int = 0) -> list[Problem]:
  """Problems 0..n-1 of the suite `seed`. Problem i depends only on (seed, i, categories,
  steps), so a shorter list is a prefix of a longer one. steps > 0: the easy tier of chains of
  exactly that many subtasks (1: one function applying one op to the input)."""
  if categories is not None:
    categories = _check_categories(categories, "category")
    if not categories:
      raise ValueError("synthetic: categories is empty")
  return [synthetic_gen.build(seed, i, categories, steps) for i in range(n)]


def split(problems: Sequence[Problem], which: str,
          holdout: Sequence[str] = DEFAULT_HOLDOUT) -> list[Problem]:
  """Hold out whole categories: "test" keeps the problems with at least one subtask of a held-out
  category, "train" the others (so no train problem ever shows a held-out subtask type). The two
  partition `problems`, in their order."""
  held = set(_check_categories(holdout, "holdout category"))
  if which not in ("train", "test"):
    raise ValueError(f"split: which={which!r}; expected 'train' or 'test'")
  return [p for p in problems if bool(held & set(p.data["categories"])) == (which == "test")]


def instance_split(problems: Sequence[Problem], which: str, categories: Sequence[str],
                   test_problems: int) -> list[Problem]:
  """Disjoint problems that all contain a subtask of `categories`: "test" is the first
  `test_problems` of them, "train" the rest (for a backbone that has seen the categories a
  little, so RL has something to improve and is still scored on problems it never trained on)."""
  focus = set(_check_categories(categories, "category"))
  if which not in ("train", "test"):
    raise ValueError(f"split: which={which!r}; expected 'train' or 'test'")
  if test_problems < 1:
    raise ValueError(f"instance_split: test_problems={test_problems!r} must be >= 1")
  kept = [p for p in problems if focus & set(p.data["categories"])]
  return kept[:test_problems] if which == "test" else kept[test_problems:]


def reference_artifact(problem: Problem, node_id: str) -> str:
  """The node's reference implementation as a perfect executor would reply."""
  return f"```python\n{problem.data['nodes'][str(node_id)]['reference']}```\n"


def _defined(code: str | None) -> list[str]:
  try:
    tree = verifier.parse(code or "")  # under the verifier's lock: scorers run in threads
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return []
  return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def _find(problem: Problem, node: Mapping[str, Any],
          code: str | None = None) -> tuple[str, Mapping[str, Any]] | None:
  """The gold subtask a node stands for: by id, else by title (a function name), else by the
  last gold function the code defines (a planner's graph has its own ids)."""
  nodes = problem.data["nodes"]
  if str(node.get("id")) in nodes:
    return str(node["id"]), nodes[str(node["id"])]
  by_name = {spec["function"]: i for i, spec in nodes.items()}
  title = str(node.get("title", "")).strip().strip("`").split("(")[0].removeprefix("def ")
  if title in by_name:
    return by_name[title], nodes[by_name[title]]
  hits = [by_name[name] for name in _defined(code) if name in by_name]
  if hits:
    best = max(hits, key=int)
    return best, nodes[best]
  return None


def _ancestors(problem: Problem, node_id: str) -> list[str]:
  parents = {n["id"]: n["depends_on"] for n in problem.gold_graph}
  seen: set[str] = set()
  stack = list(parents[node_id])
  while stack:
    u = stack.pop()
    if u not in seen:
      seen.add(u)
      stack.extend(parents[u])
  return sorted(seen, key=int)


def _ordered(problem: Problem, ids: Sequence[str]) -> list[str]:
  """Gold ids in topological (numeric) order, then any other ids in the order given."""
  gold = [i for i in ids if i in problem.data["nodes"]]
  return sorted(gold, key=int) + [i for i in ids if i not in problem.data["nodes"]]


def _codes(problem: Problem, artifacts: Mapping[str, str | None]) -> list[str]:
  """The code blocks of the artifacts, in order; missing, unfenced or uncompilable ones are left
  out (one broken block must not take the others down with it)."""
  out = []
  for i in _ordered(problem, [str(k) for k in artifacts]):
    text = artifacts.get(i)
    code = verifier.extract_code(text) if text is not None else None
    if code and code.strip() and verifier.syntax_error(code) is None:
      out.append(code)
  return out


def _cases(tests: Sequence[str]) -> list[tuple[list[Any], Any]]:
  """(arguments, expected value) of each `assert f(args) == expected` unit test."""
  out = []
  for test in tests:
    try:
      check = verifier.parse(test).body[0].test
      out.append(([ast.literal_eval(a) for a in check.left.args],
                  ast.literal_eval(check.comparators[0])))
    except (SyntaxError, ValueError, TypeError, AttributeError, IndexError, RecursionError):
      continue  # not of that form: no answer that ignores its input is known to pass it
  return out


def null_bodies(problem: Problem, node_id: str) -> dict[str, str]:
  """The null programs measured on a node (`nulls.node_bodies`): the generic ones, each expected
  value of its tests as a constant and zeros / ones like it, and each ancestor's result (the
  prompt names the ancestors' functions)."""
  spec = problem.data["nodes"][node_id]
  ancestors = [problem.data["nodes"][a]["function"] for a in _ancestors(problem, node_id)]
  return nulls.node_bodies([y for _, y in _cases(spec["tests"])], ancestors)


@dataclasses.dataclass
class Synthetic:
  """The synthetic task family. A node's reward is the share of its unit tests passed beyond
  what the best null program passes (`base.reward_above_null`; measured, `null_baseline`: e.g.
  `return []` passes the edge case `f([]) == []`), run on its code after the code of its passed
  ancestors; it passes when all pass.

  Limits (`verifier.run_tests`): `timeout_s`, the wall-clock seconds of one sandbox call (all of
  a suite's tests); `per_test_timeout_s`, the CPU seconds of one test, so that a loaded machine
  does not fail a correct program; `per_test_wall_s`, one test's wall-clock seconds, which stop
  a program that sleeps or blocks (None: `verifier.per_test_limits`' default, several times the
  CPU limit)."""

  timeout_s: float = 10.0
  per_test_timeout_s: float | None = 2.0
  per_test_wall_s: float | None = None
  workers: int = 8  # sandbox calls in flight at once in score_problem
  name: str = FAMILY

  def __post_init__(self):
    verifier.per_test_limits(self.per_test_timeout_s, self.per_test_wall_s)  # raises when bad

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    found = _find(problem, node)
    if found is None:  # a planner's node with no gold counterpart
      final = problem.data["nodes"][problem.data["final"]]["signature"]
      return (f"Write the Python code for this step: {node.get('title', '')}: "
              f"{node.get('description', '')}\nThe finished program must define `{final}`; "
              "functions written in earlier steps are already defined and may be called by "
              f"name.\n{_FOOTER}")
    node_id, spec = found
    parts = [spec["description"]]
    earlier = [problem.data["nodes"][i]["signature"] for i in _ancestors(problem, node_id)]
    if earlier:
      listed = "\n".join(f"  {sig}" for sig in earlier)
      parts.append("These functions from earlier steps are already defined and may be called by "
                   f"name; do not redefine them:\n{listed}")
    parts.append(f"{_FOOTER} The function header:\n```python\n{spec['signature']}\n```")
    return "\n\n".join(parts)

  def _run(self, program: str, tests: Sequence[str], timeout_s: float | None = None,
           **kwargs) -> verifier.TestRun:
    return verifier.run_tests(program, tests, timeout_s=timeout_s or self.timeout_s,
                              per_test_timeout_s=self.per_test_timeout_s,
                              per_test_wall_s=self.per_test_wall_s, **kwargs)

  def null_baseline(self, problem: Problem, node_id: str) -> int:
    """The most unit tests of gold node `node_id` that one null program passes (`null_bodies`),
    run after the reference code of the node's ancestors; measured once per node and cached."""
    spec = problem.data["nodes"][node_id]
    upstream = [problem.data["nodes"][a]["reference"] for a in _ancestors(problem, node_id)]
    bodies = null_bodies(problem, node_id)

    def measure() -> int:
      def run(program, tests, **kwargs):
        return self._run("\n\n".join(upstream + [program]), tests,
                         self.timeout_s * len(bodies), **kwargs)
      return max(nulls.measure(run, spec["function"], spec["tests"], bodies).values())
    return nulls.cached(nulls.key(spec["tests"], bodies, upstream), measure)

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    checked = verifier.CodeCheck()(artifact)
    if not checked.ok:
      return NodeScore(0.0, False, {"reason": checked.reason})
    found = _find(problem, node, checked.code)
    if found is None:
      return NodeScore(0.0, False, {"reason": "the node matches no subtask of the task (by id, "
                                              "title or a function it defines)"})
    node_id, spec = found
    program = "\n\n".join(_codes(problem, upstream) + [checked.code])
    run = self._run(program, spec["tests"])
    baseline = self.null_baseline(problem, node_id)
    details: dict[str, Any] = {"function": spec["function"], "tests_passed": run.passed,
                               "tests": run.total, "null_baseline": baseline,
                               "isolation": run.isolation}
    if run.errors:
      details["reason"] = "; ".join(run.errors)[:1000]
    reward = base.reward_above_null(run.passed, run.total, baseline)
    return NodeScore(reward, run.total > 0 and run.passed == run.total, details)

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    """Joins the code of all non-None artifacts (gold order) into one program and runs, each in
    its own sandbox call (in parallel), every subtask's unit tests and the hidden tests of the
    final function. step_pass: the fraction of subtasks whose function in that program passes
    all its unit tests (a blocked subtask's function is missing, unless another artifact defines
    it); hidden_pass: 1 when all hidden tests pass, which is also `passed`."""
    program = "\n\n".join(_codes(problem, artifacts))
    specs = list(problem.data["nodes"].values())
    if not program.strip():
      return ProblemScore(False, {"step_pass": 0.0, "hidden_pass": 0.0})
    suites = [spec["tests"] for spec in specs] + [problem.data["hidden_tests"]]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(self.workers, len(suites)))) as pool:
      runs = list(pool.map(lambda tests: self._run(program, tests), suites))
    steps = [r.total > 0 and r.passed == r.total for r in runs[:-1]]
    hidden = runs[-1].total > 0 and runs[-1].passed == runs[-1].total
    return ProblemScore(hidden, {"step_pass": sum(steps) / len(steps),
                                 "hidden_pass": float(hidden)})
