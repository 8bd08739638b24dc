"""SciCode in the official layout, as chains of sub-step nodes.

Each problem holds `problem_id`, `problem_name`, `problem_description_main`, `problem_io`,
`required_dependencies` (import lines), `sub_steps` ({step_number, step_description_prompt,
step_background, function_header, test_cases, return_line}) and `general_tests`. The gold graph
is the chain of sub-steps (step k depends on step k-1). A step's code runs after the required
imports and the code of the upstream steps; its reward is the fraction of its test cases passed.

Limits:
- The released data has no category field. A problem's category comes from a `categories`
  mapping (problem_id -> category, or the path of a JSON object file), else a `category` (or
  `domain`) key in the problem, else "unknown"; "unknown" problems are in neither split.
- Real SciCode tests compare against `target` values kept in an HDF5 file (test_data.h5) and
  sometimes import `scicode.compare`. Give the file as `targets_h5` (read as the official harness
  does, by `scicode_targets`, under step id "<problem_id>.<step>"), or pass the values as
  `targets` (step_number -> one value per test case), which win for the steps they name. Values
  (numbers, strings, lists, tuples, dicts, None, numpy arrays and scalars, scipy sparse matrices)
  are turned into source by `target_source`. A test that uses `target` for which no value was
  supplied raises MissingTargetsError naming the problem and step; self-contained asserts need
  nothing.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import json
import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from morse_jax.mas import verifier
from morse_jax.tasks import scicode_targets
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore

FAMILY = "scicode"
TRAIN_CATEGORIES = ("physics", "math", "material science")
TEST_CATEGORIES = ("chemistry", "biology")
_ALIASES = {"mathematics": "math", "materials science": "material science",
            "materials": "material science"}


class MissingTargetsError(ValueError):
  """A test compares against `target` but no target value was supplied for it."""


def normalise_category(category: str) -> str:
  name = " ".join(category.lower().replace("_", " ").split())
  return _ALIASES.get(name, name)


def split(problems: Sequence[Problem], which: str) -> list[Problem]:
  """Out-of-domain split: train on Physics + Math + Material Science, test on Chemistry +
  Biology."""
  wanted = {"train": TRAIN_CATEGORIES, "test": TEST_CATEGORIES}.get(which)
  if wanted is None:
    raise ValueError(f"split: which={which!r}; expected 'train' or 'test'")
  return [p for p in problems if normalise_category(p.category) in wanted]


def _check(where: str, raw: Mapping[str, Any], field: str, kind: type | tuple[type, ...],
           default: Any = None) -> Any:
  value = raw.get(field, default)
  if not isinstance(value, kind) or isinstance(value, bool):
    got = "missing" if field not in raw else f"a {type(value).__name__}"
    kinds = kind if isinstance(kind, tuple) else (kind,)
    raise ValueError(f"{where}: field {field!r} is {got}; expected "
                     f"{' or '.join(k.__name__ for k in kinds)}")
  return value


def _parse_problem(raw: Any, where: str, categories: Mapping[str, str]) -> Problem:
  if not isinstance(raw, dict):
    raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
  pid = str(_check(where, raw, "problem_id", (str, int)))
  data = {f: _check(where, raw, f, str, "") for f in
          ("problem_name", "problem_description_main", "problem_io", "required_dependencies")}
  if not data["problem_description_main"].strip():
    raise ValueError(f"{where}: field 'problem_description_main' is empty")
  steps = _check(where, raw, "sub_steps", list)
  if not steps:
    raise ValueError(f"{where}: field 'sub_steps' is empty")
  data["sub_steps"] = []
  for j, s in enumerate(steps):
    at = f"{where}: sub_steps[{j}]"
    if not isinstance(s, dict):
      raise ValueError(f"{at}: expected an object, got {type(s).__name__}")
    step = {"step_number": str(_check(at, s, "step_number", (str, int, float)))}
    for f in ("step_description_prompt", "function_header"):
      step[f] = _check(at, s, f, str)
    for f in ("step_background", "return_line"):
      step[f] = _check(at, s, f, str, "")
    step["test_cases"] = _check(at, s, "test_cases", list)
    if not all(isinstance(t, str) for t in step["test_cases"]):
      raise ValueError(f"{at}: field 'test_cases' must be a list of strings")
    if any(p["step_number"] == step["step_number"] for p in data["sub_steps"]):
      raise ValueError(f"{at}: field 'step_number' {step['step_number']!r} is repeated")
    data["sub_steps"].append(step)
  data["general_tests"] = _check(where, raw, "general_tests", list, [])
  category = categories.get(pid) or raw.get("category") or raw.get("domain") or "unknown"
  if not isinstance(category, str):
    raise ValueError(f"{where}: field 'category' must be a string")
  graph, prev = [], None
  for step in data["sub_steps"]:
    name = re.search(r"(?:def|class)\s+(\w+)", step["function_header"])
    graph.append({"id": step["step_number"], "depends_on": [prev] if prev else [],
                  "title": name.group(1) if name else f"step {step['step_number']}",
                  "description": step["step_description_prompt"].strip()})
    prev = step["step_number"]
  statement = "\n\n".join(x.strip() for x in (data["problem_name"],
                            data["problem_description_main"], data["problem_io"]) if x.strip())
  return Problem(id=pid, family=FAMILY, category=category.strip(), statement=statement,
                 gold_graph=graph, data=data)


def load(path: str, categories: Mapping[str, str] | str | None = None) -> list[Problem]:
  """Problems of a SciCode .json (a list) or .jsonl file. Errors name the file, the line (jsonl)
  or problem index (json), and the field."""
  if isinstance(categories, str):
    with open(categories, encoding="utf-8") as f:
      mapping = json.load(f)
    if not isinstance(mapping, dict):
      raise ValueError(f"{categories}: expected a JSON object problem_id -> category")
    categories = mapping
  categories = {str(k): v for k, v in (categories or {}).items()}
  with open(path, encoding="utf-8") as f:
    text = f.read()
  items: list[tuple[str, Any]] = []
  if path.endswith(".jsonl"):
    for lineno, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          items.append((f"{path}:{lineno}", json.loads(line)))
        except ValueError as e:
          raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
  else:
    try:
      raw = json.loads(text)
    except ValueError as e:
      raise ValueError(f"{path}: not JSON: {e}") from e
    if not isinstance(raw, list):
      raise ValueError(f"{path}: expected a JSON list of problems, got {type(raw).__name__}")
    items = [(f"{path}: problem {i}", r) for i, r in enumerate(raw)]
  problems, seen = [], set()
  for where, raw in items:
    problem = _parse_problem(raw, where, categories)
    if problem.id in seen:
      raise ValueError(f"{where}: field 'problem_id' {problem.id!r} is repeated")
    seen.add(problem.id)
    problems.append(problem)
  return problems


def _step(problem: Problem, node_id: str) -> Mapping[str, Any]:
  for step in problem.data["sub_steps"]:
    if step["step_number"] == str(node_id):
      return step
  raise ValueError(f"scicode problem {problem.id}: no sub-step {node_id!r} (node ids must be "
                   "step numbers)")


_NP = "__import__('numpy')"
_INLINE_ITEMS = 256  # larger plain arrays travel as base64 bytes: exact, and quick to compile


def _dtype_source(dtype: np.dtype) -> str:
  # dtype.str drops the field names of a structured dtype; descr keeps them.
  spec = dtype.descr if dtype.fields is not None else dtype.str
  return f"{_NP}.dtype({target_source(spec)})"


def _array_source(value: np.ndarray) -> str:
  shape = tuple(int(n) for n in value.shape)
  if value.dtype.hasobject:  # item by item: np.array would merge equal-shaped items into axes
    items = target_source(list(value.ravel()))
    return f"{_NP}.fromiter({items}, dtype=object, count={value.size}).reshape({shape!r})"
  dtype = _dtype_source(value.dtype)
  if value.size <= _INLINE_ITEMS:
    return f"{_NP}.array({target_source(value.tolist())}, dtype={dtype}).reshape({shape!r})"
  data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
  return (f"{_NP}.frombuffer(__import__('base64').b64decode({data!r}), dtype={dtype})"
          f".reshape({shape!r}).copy()")


def _sparse_source(value: Any) -> str:
  import scipy.sparse  # pylint: disable=g-import-not-at-top  (only sparse values need it)
  kind = "matrix" if scipy.sparse.isspmatrix(value) else "array"
  make = f"__import__('scipy.sparse').sparse.{value.format}_{kind}"
  shape = tuple(int(n) for n in value.shape)
  if value.format == "coo":
    row, col = _array_source(value.row), _array_source(value.col)
    return f"{make}(({_array_source(value.data)}, ({row}, {col})), shape={shape!r})"
  if value.format in ("csr", "csc", "bsr"):
    parts = ", ".join(_array_source(a) for a in (value.data, value.indices, value.indptr))
    extra = ""
    if value.format == "bsr":
      extra = f", blocksize={tuple(int(n) for n in value.blocksize)!r}"
    return f"{make}(({parts}), shape={shape!r}{extra})"
  return f"{make}({_sparse_source(value.tocoo())})"  # lil, dok, dia: rebuilt through coo


def target_source(value: Any) -> str:
  """Python source that rebuilds `value` inside the sandbox."""
  if type(value).__module__.startswith("scipy.sparse"):
    return _sparse_source(value)
  if isinstance(value, np.generic):  # a numpy scalar stays one (h5py reads scalars as these)
    if value.dtype.fields is not None:  # a structured record
      return f"{_NP}.array({target_source(value.item())}, dtype={_dtype_source(value.dtype)})[()]"
    return f"{_dtype_source(value.dtype)}.type({target_source(value.item())})"
  if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy (or jax) array
    return _array_source(np.asarray(value))
  if isinstance(value, float) and not math.isfinite(value):
    return f"float({str(value)!r})"
  if isinstance(value, complex):
    return f"complex({target_source(value.real)}, {target_source(value.imag)})"
  if value is None or isinstance(value, (bool, int, float, str, bytes)):
    return repr(value)
  if isinstance(value, (list, tuple)):
    items = ", ".join(target_source(v) for v in value)
    return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{target_source(k)}: {target_source(v)}"
                           for k, v in value.items()) + "}"
  raise TypeError(f"target_source: cannot write a {type(value).__name__} as source")


def step_id(problem_id: str, step_number: str) -> str:
  """The official step id ("13.6"): released step numbers already carry the problem id, bare
  ones ("6") get it prepended."""
  number = str(step_number)
  return number if number.startswith(f"{problem_id}.") else f"{problem_id}.{number}"


def _uses_target(test: str) -> bool:
  try:
    return any(isinstance(n, ast.Name) and n.id == "target" for n in ast.walk(verifier.parse(test)))
  except SyntaxError:
    return re.search(r"\btarget\b", test) is not None


def _counts(result: ProblemScore | Sequence[bool]) -> tuple[int, int]:
  if isinstance(result, ProblemScore):
    return int(result.metrics["steps_passed"]), int(result.metrics["steps"])
  return sum(bool(x) for x in result), len(result)


def step_pass(results: Sequence[ProblemScore | Sequence[bool]]) -> float:
  """Steps passed / all steps, over all problems (each result: a ProblemScore of this family or
  the per-step pass flags of one problem)."""
  counts = [_counts(r) for r in results]
  total = sum(n for _, n in counts)
  return sum(k for k, _ in counts) / total if total else 0.0


def mean_step_pass(results: Sequence[ProblemScore | Sequence[bool]]) -> float:
  """The mean over problems of each problem's fraction of steps passed."""
  counts = [_counts(r) for r in results]
  return sum(k / n for k, n in counts if n) / len(counts) if counts else 0.0


def problem_pass(results: Sequence[ProblemScore | Sequence[bool]]) -> float:
  """The fraction of problems with every step passed."""
  counts = [_counts(r) for r in results]
  return sum(n > 0 and k == n for k, n in counts) / len(counts) if counts else 0.0


@dataclasses.dataclass
class SciCode:
  """The SciCode task family. `targets`: step_number -> one value per test case; `targets_h5`: the
  official test_data.h5, read for the steps `targets` does not name."""

  targets: Mapping[str, Sequence[Any]] | None = None
  targets_h5: str | None = None
  with_background: bool = False
  timeout_s: float = 30.0
  per_test_timeout_s: float | None = 10.0
  name: str = FAMILY
  _h5: scicode_targets.TargetFile | None = dataclasses.field(default=None, init=False,
                                                             repr=False, compare=False)

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    step = _step(problem, node["id"])
    parts = [f"PROBLEM: {problem.data['problem_description_main'].strip()}",
             f"NEXT STEP: {step['step_description_prompt'].strip()}"]
    if self.with_background and step.get("step_background", "").strip():
      parts.append(f"BACKGROUND: {step['step_background'].strip()}")
    deps = problem.data["required_dependencies"].strip()
    if deps:
      parts.append("DEPENDENCIES: use only these; they are already imported, together with the "
                   f"functions of the earlier steps:\n```python\n{deps}\n```")
    header = step["function_header"].rstrip()
    ret = step.get("return_line", "").rstrip()
    parts.append("Implement this function header. Reply with the complete function in one "
                 "```python code block, with no placeholders (`pass`, TODO) and no test code:\n"
                 f"```python\n{header}\n{ret}\n```")
    return "\n\n".join(parts)

  def _tests(self, problem: Problem, step: Mapping[str, Any]) -> list[str]:
    number = step["step_number"]
    values = (self.targets or {}).get(number)
    if values is None and self.targets_h5 and any(_uses_target(t) for t in step["test_cases"]):
      if self._h5 is None or self._h5.path != self.targets_h5:
        self._h5 = scicode_targets.TargetFile(self.targets_h5)
      try:
        values = self._h5.targets(step_id(problem.id, number), len(step["test_cases"]))
      except scicode_targets.TargetsNotFoundError as e:
        raise MissingTargetsError(f"scicode problem {problem.id} step {number}: {e}") from e
    tests = []
    for i, test in enumerate(step["test_cases"]):
      if _uses_target(test):
        if values is None or i >= len(values):
          raise MissingTargetsError(
              f"scicode problem {problem.id} step {number}: test case {i} compares against "
              "`target`, but no target value was supplied (SciCode keeps them in test_data.h5; "
              "pass SciCode(targets={step_number: [value per test case]}))")
        test = f"target = {target_source(values[i])}\n{test}"
      tests.append(test)
    return tests

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    step = _step(problem, node["id"])
    tests = self._tests(problem, step)
    checked = verifier.CodeCheck()(artifact)
    if not checked.ok:
      return NodeScore(0.0, False, {"reason": checked.reason})
    order = [s["step_number"] for s in problem.data["sub_steps"]]
    ids = [i for i in order if i in upstream] + [i for i in upstream if i not in order]
    upstream_code = [verifier.extract_code(upstream[i]) or upstream[i] for i in ids]
    program = "\n\n".join([problem.data["required_dependencies"], *upstream_code, checked.code])
    run = verifier.run_tests(program, tests, timeout_s=self.timeout_s,
                             per_test_timeout_s=self.per_test_timeout_s)
    details: dict[str, Any] = {"tests_passed": run.passed, "tests": run.total,
                               "isolation": run.isolation}
    if run.errors:
      details["reason"] = "; ".join(run.errors)[:1000]
    if run.total == 0:  # a step without tests: it passes when its program runs
      ok = not run.errors
      return NodeScore(float(ok), ok, details)
    return NodeScore(run.fraction, run.passed == run.total, details)

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    """Each step re-scored in order, with the steps that passed before it as its upstream."""
    passed: dict[str, str] = {}
    flags = []
    for node in problem.gold_graph:
      artifact = artifacts.get(node["id"])
      ok = artifact is not None and self.score_node(problem, node, artifact, passed).passed
      if ok:
        passed[node["id"]] = artifact
      flags.append(ok)
    k, n = sum(flags), len(flags)
    return ProblemScore(k == n, {"steps_passed": float(k), "steps": float(n),
                                 "step_pass": k / n, "problem_pass": float(k == n)})
