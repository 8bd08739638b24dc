"""SciCode in the official layout, as chains of sub-step nodes.

Each problem holds `problem_id`, `problem_name`, `problem_description_main`, `problem_io`,
`required_dependencies` (import lines), `sub_steps` ({step_number, step_description_prompt,
step_background, function_header, test_cases, return_line, and in the dev problems
ground_truth_code}) and `general_tests`. The gold graph is the chain of sub-steps (step k depends
on step k-1). A step's code runs after the required imports and the code of the upstream steps;
its test cases then run in order in one namespace, as the official harness runs them (a later
test may use names an earlier one bound); its reward is the share of its test cases passed beyond
those one constant answer passes (the largest group of tests with equal targets:
`base.reward_above_null`; e.g. 19.2's n-tangle is 1, 1, 0, 0 on its four states, so a
constant passes two and earns 0).
A step without test cases (13.6, 62.1, 76.3 in the official files; `untested_steps`) earns
reward 0 and is left out of the step counts; it still flows downstream when its code runs, and
the later steps that call it check it.
The test cases run in the verifier's trusted harness after the required imports, calling the
step's functions in the sandbox (and the upstream steps' functions in a sandbox of their own):
see `verifier.run_tests` and docs/SECURITY.md.

`load()` with no path reads the installed nvidia-scicode package's problems_all.jsonl (65) and
problems_dev.jsonl (15). A problem's category comes from a `categories` mapping (problem_id ->
category, or the path of a JSON object file), else a `category` (or `domain`) key in the problem,
else the MoRSE authors' domain table (`scicode_data`, matched by id and name), else "unknown".
`split` gives the authors' out-of-domain split (train: Physics + Math + Material Science, test:
Chemistry + Biology; "unknown" problems are in neither) or their in-domain split, or all.

Targets. SciCode tests compare against `target` values the official harness reads from
test_data.h5 (not shipped by the package), and some import `scicode.compare` (shipped into the
sandbox from the installed package). In order, for each step: `targets` (step_number -> one value
per test case), then `targets_h5` (read as the official harness does, by `scicode_targets`, under
step id "<problem_id>.<step>"), then values computed from the gold code in the sandbox
(`scicode_gold`, cached on disk) for steps that have it, the dev problems' steps. Values (numbers,
strings, lists, tuples, dicts, None, numpy arrays and scalars, scipy sparse matrices) are turned
into source by `target_source`. A test that uses `target` with none of these raises
MissingTargetsError naming the problem, the step and the options; self-contained asserts need
nothing.

A node whose id is no step number (the `single` system's one node, a planner's own node) stands
for the whole problem: the executor is asked for every step's function in one reply, and the
reply (after its upstream code) is run against every step's tests. Its reward is the fraction of
the problem's steps whose tests all pass, the same step_pass the chain is scored by, and
score_problem reports steps_passed / steps / problem_pass for it the same way. Such a node
`passes` (flows downstream, keeps its artifact for score_problem) when its code is usable:
fenced, compiling, no placeholder.
"""

from __future__ import annotations

import ast
import base64
import concurrent.futures
import dataclasses
import json
import logging
import math
import re
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from morse_jax.execution import verifier
from morse_jax.tasks import nulls
from morse_jax.tasks import scicode_data
from morse_jax.tasks import scicode_gold
from morse_jax.tasks import scicode_targets
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore, null_baseline
from morse_jax.tasks.base import reward_above_null

FAMILY = "scicode"
log = logging.getLogger(__name__)
_LOCK = threading.Lock()  # the families' lazily opened target stores
TRAIN_CATEGORIES = ("physics", "math", "material science")
TEST_CATEGORIES = ("chemistry", "biology")
_ALIASES = {"mathematics": "math", "materials science": "material science",
            "materials": "material science"}


class MissingTargetsError(ValueError):
  """A test compares against `target` but no target value is available for it."""


_OPTIONS = ("give SciCode's test_data.h5 as targets_h5 (config task.targets_h5), or use "
            "problems whose steps carry ground_truth_code (the 15 dev problems of "
            "problems_dev.jsonl), whose targets are computed from it (gold_targets=True), or "
            "pass SciCode(targets={step_number: [value per test case]})")


def normalise_category(category: str) -> str:
  name = " ".join(category.lower().replace("_", " ").split())
  return _ALIASES.get(name, name)


def split(problems: Sequence[Problem], which: str, scheme: str = "ood") -> list[Problem]:
  """which: "train", "test" or "all" (every problem). scheme "ood": by category, train on
  Physics + Math + Material Science, test on Chemistry + Biology; "in_domain": the authors'
  stratified split of the 80 official problems (`scicode_data`: test the 20 of their mydev.jsonl,
  train the other 60), which other problems are in neither part of."""
  if which not in scicode_data.WHICH:
    raise ValueError(f"split: which={which!r}; expected one of {scicode_data.WHICH}")
  if scheme not in scicode_data.SCHEMES:
    raise ValueError(f"split: scheme={scheme!r}; expected one of {scicode_data.SCHEMES}")
  if which == "all":
    return list(problems)
  if scheme == "in_domain":
    ids = scicode_data.split_ids(which, "in_domain")
    return [p for p in problems if p.id in ids
            and scicode_data.domain(p.id, p.data.get("problem_name", "")) is not None]
  wanted = TRAIN_CATEGORIES if which == "train" else TEST_CATEGORIES
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
    for f in ("step_background", "return_line"):  # null in the official file (13.6, 62.1)
      step[f] = _check(at, s, f, (str, type(None)), "") or ""
    gold = _check(at, s, "ground_truth_code", (str, type(None)))
    if gold is not None:  # the dev problems' gold code: their targets are computed from it
      step["ground_truth_code"] = gold
    step["test_cases"] = _check(at, s, "test_cases", list)
    if not all(isinstance(t, str) for t in step["test_cases"]):
      raise ValueError(f"{at}: field 'test_cases' must be a list of strings")
    if any(p["step_number"] == step["step_number"] for p in data["sub_steps"]):
      raise ValueError(f"{at}: field 'step_number' {step['step_number']!r} is repeated")
    data["sub_steps"].append(step)
  data["general_tests"] = _check(where, raw, "general_tests", list, [])
  category = (categories.get(pid) or raw.get("category") or raw.get("domain")
              or scicode_data.domain(pid, data["problem_name"]) or "unknown")
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


def _items(path: str) -> list[tuple[str, Any]]:
  """(where, raw problem) of a .json (a list) or .jsonl file."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".jsonl"):
    items = []
    for lineno, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          items.append((f"{path}:{lineno}", json.loads(line)))
        except ValueError as e:
          raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
    return items
  try:
    raw = json.loads(text)
  except ValueError as e:
    raise ValueError(f"{path}: not JSON: {e}") from e
  if not isinstance(raw, list):
    raise ValueError(f"{path}: expected a JSON list of problems, got {type(raw).__name__}")
  return [(f"{path}: problem {i}", r) for i, r in enumerate(raw)]


def load(path: str | None = None,
         categories: Mapping[str, str] | str | None = None) -> list[Problem]:
  """Problems of a SciCode .json (a list) or .jsonl file; with no path, the installed
  nvidia-scicode package's problems_all.jsonl and problems_dev.jsonl (80 problems). Errors name
  the file, the line (jsonl) or problem index (json), and the field."""
  if isinstance(categories, str):
    with open(categories, encoding="utf-8") as f:
      mapping = json.load(f)
    if not isinstance(mapping, dict):
      raise ValueError(f"{categories}: expected a JSON object problem_id -> category")
    categories = mapping
  categories = {str(k): v for k, v in (categories or {}).items()}
  paths = [path] if path else scicode_data.installed_files()
  problems, seen = [], set()
  for file in paths:
    for where, raw in _items(file):
      problem = _parse_problem(raw, where, categories)
      if problem.id in seen:
        raise ValueError(f"{where}: field 'problem_id' {problem.id!r} is repeated")
      seen.add(problem.id)
      problems.append(problem)
  total = sum(len(p.data["sub_steps"]) for p in problems)
  for steps, what in ((untested_steps(problems), "have no test cases"),
                      (property_only_steps(problems), "compare against no reference value")):
    if steps:
      log.info("scicode: %d of %d steps (in %d of %d problems) %s: %s; they earn no reward of "
               "their own", len(steps), total, len({u.rsplit(".", 1)[0] for u in steps}),
               len(problems), what, ", ".join(steps))
  return problems


def untested_steps(problems: Sequence[Problem]) -> list[str]:
  """The official ids ("13.6") of the steps of `problems` that have no test cases (in the
  official files: 13.6, 62.1, 76.3). Such a step earns no reward of its own and is left out of
  the step counts; its code is checked by the later steps that call it."""
  return [step_id(p.id, s["step_number"]) for p in problems for s in p.data["sub_steps"]
          if not s["test_cases"]]


def _tested(problem: Problem) -> list[Mapping[str, Any]]:
  return [s for s in problem.data["sub_steps"] if s["test_cases"]]


def sub_step(problem: Problem, node_id: str) -> Mapping[str, Any] | None:
  """The sub-step a node stands for; None for a node that stands for the whole problem."""
  for step in problem.data["sub_steps"]:
    if step["step_number"] == str(node_id):
      return step
  return None


def _index(problem: Problem, step: Mapping[str, Any]) -> int:
  return [s["step_number"] for s in problem.data["sub_steps"]].index(step["step_number"])


def _compares_to_reference(test: str) -> bool:
  """Whether a test compares an answer against a reference value it holds: `target`, or a
  literal other than None / True / False in a comparison (`== 14`, `np.isclose(x, 0.2)`)."""
  return _uses_target(test) or any(v is not None and not isinstance(v, bool)
                                   for v in nulls.literals(test, assigned=False))


def property_only(step: Mapping[str, Any]) -> bool:
  """A step with tests none of which compares against a reference value (`target` or a
  literal): they check properties of the answer (78.1 and 78.2 in the official files; a
  constant passes 78.2's: `final_state[0] < state[0]`, no NaN), so the step earns no reward of
  its own; it still flows downstream when its tests pass."""
  return bool(step["test_cases"]) and not any(map(_compares_to_reference, step["test_cases"]))


def property_only_steps(problems: Sequence[Problem]) -> list[str]:
  """The official ids of the steps of `problems` that only check properties (`property_only`)."""
  return [step_id(p.id, s["step_number"]) for p in problems for s in p.data["sub_steps"]
          if property_only(s)]


def has_gold(problem: Problem) -> bool:
  """Every step carries ground_truth_code (the dev problems)."""
  return all(s.get("ground_truth_code") for s in problem.data["sub_steps"])


def step_code(problem: Problem, node_id: str) -> str:
  """A step's gold code."""
  step = sub_step(problem, node_id)
  if step is None or not step.get("ground_truth_code"):
    raise ValueError(f"scicode problem {problem.id}: step {node_id!r} has no ground_truth_code")
  return step["ground_truth_code"].rstrip() + "\n"


def gold_artifact(problem: Problem, node_id: str) -> str:
  """A step's gold code as a perfect executor would reply."""
  return f"```python\n{step_code(problem, node_id)}```\n"


def _usable_code(text: str | None) -> str | None:
  """The code of a reply when score_node would accept it (fenced, compiling, no stub)."""
  checked = verifier.CodeCheck()(text) if text is not None else None
  return checked.code if checked is not None and checked.ok else None


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


def _same_target(a: Any, b: Any) -> bool:
  """Whether one answer can match both targets: the same structure (list / tuple lengths, dict
  keys, array shapes) and, for numbers, allclose (NaN matching NaN); otherwise ==."""
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same_target(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same_target(a[k], b[k]) for k in a)
  try:
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
      return False
    if x.dtype.kind in "biufc" and y.dtype.kind in "biufc":
      return bool(np.allclose(x, y, equal_nan=True))
    return bool(np.all(x == y)) if x.dtype == y.dtype else False
  except (ValueError, TypeError):
    return False


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
  """The SciCode task family. Targets: `targets` (step_number -> one value per test case), else
  `targets_h5` (the official test_data.h5), else computed from the gold code when
  `gold_targets` (cached under `targets_cache`; None: in memory only).

  Time limits: the official harness gives a step's test script 1800 s; the slowest dev step's
  gold code (51.4, a pure-Python MD run, four tests) takes about 75 s on a busy 2-core machine,
  so a step gets `timeout_s` (wall clock) in all and each test `per_test_timeout_s` of CPU time
  (so that machine load does not decide a reward) and `per_test_wall_s` of wall-clock time
  (which stops a program that sleeps or blocks; None: `verifier.per_test_limits`' default,
  several times the CPU limit). Memory: the official harness sets no limit; `memory_mb` (the
  sandbox's address-space limit) lets every dev step's gold code run."""

  targets: Mapping[str, Sequence[Any]] | None = None
  targets_h5: str | None = None
  gold_targets: bool = True
  targets_cache: str | None = scicode_gold.DEFAULT_CACHE
  with_background: bool = False
  timeout_s: float = 300.0
  per_test_timeout_s: float | None = 120.0
  per_test_wall_s: float | None = None
  memory_mb: int = 4096  # address space; 10.11's gold code (an Ewald sum) makes 738 MiB arrays
  workers: int = 4  # sandbox calls in flight at once when one node is run against every step
  name: str = FAMILY
  _h5: scicode_targets.TargetFile | None = dataclasses.field(default=None, init=False,
                                                             repr=False, compare=False)
  _gold: scicode_gold.GoldTargets | None = dataclasses.field(default=None, init=False,
                                                             repr=False, compare=False)

  def __post_init__(self):
    verifier.per_test_limits(self.per_test_timeout_s, self.per_test_wall_s)  # raises when bad

  def executor_instructions(self, problem: Problem, node: Mapping[str, Any]) -> str:
    step = sub_step(problem, node["id"])
    if step is None:
      return self._whole_instructions(problem)
    parts = [f"PROBLEM: {problem.data['problem_description_main'].strip()}",
             f"NEXT STEP: {step['step_description_prompt'].strip()}"]
    if self.with_background and step.get("step_background", "").strip():
      parts.append(f"BACKGROUND: {step['step_background'].strip()}")
    parts += self._dependencies(problem, "together with the functions of the earlier steps")
    header = step["function_header"].rstrip()
    ret = step.get("return_line", "").rstrip()
    parts.append("Implement this function header. Reply with the complete function in one "
                 "```python code block, with no placeholders (`pass`, TODO) and no test code:\n"
                 f"```python\n{header}\n{ret}\n```")
    return "\n\n".join(parts)

  def _dependencies(self, problem: Problem, also: str) -> list[str]:
    deps = problem.data["required_dependencies"].strip()
    if not deps:
      return []
    return [f"DEPENDENCIES: use only these; they are already imported, {also}:\n"
            f"```python\n{deps}\n```"]

  def _whole_instructions(self, problem: Problem) -> str:
    parts = [f"PROBLEM: {problem.data['problem_description_main'].strip()}",
             "Write the functions of all these steps, in order; a later step may call the "
             "functions of earlier ones."]
    for k, step in enumerate(problem.data["sub_steps"], 1):
      text = f"STEP {k}: {step['step_description_prompt'].strip()}"
      if self.with_background and step.get("step_background", "").strip():
        text += f"\nBACKGROUND: {step['step_background'].strip()}"
      header = step["function_header"].rstrip()
      ret = step.get("return_line", "").rstrip()
      parts.append(f"{text}\n```python\n{header}\n{ret}\n```")
    parts += self._dependencies(problem, "do not import anything else")
    parts.append("Reply with every function, complete, in one ```python code block, with no "
                 "placeholders (`pass`, TODO) and no test code.")
    return "\n\n".join(parts)

  def _gold_store(self) -> scicode_gold.GoldTargets:
    with _LOCK:
      if self._gold is None:
        self._gold = scicode_gold.GoldTargets(self.targets_cache)
      return self._gold

  def _h5_values(self, problem: Problem, number: str, count: int) -> list[Any] | None:
    """The step's values from targets_h5, or None when the file has no group for the step."""
    with _LOCK:
      if self._h5 is None or self._h5.path != self.targets_h5:
        self._h5 = scicode_targets.TargetFile(self.targets_h5)
      h5 = self._h5
    try:
      return h5.targets(step_id(problem.id, number), count)
    except scicode_targets.TargetsNotFoundError as e:
      if self.gold_targets and scicode_gold.gold_program(problem, number) is not None:
        return None  # the gold code can make them
      raise MissingTargetsError(f"scicode problem {problem.id} step {number}: {e}") from e

  def _values(self, problem: Problem, step: Mapping[str, Any]) -> Sequence[Any] | None:
    number = step["step_number"]
    values = (self.targets or {}).get(number)
    if values is not None or not any(_uses_target(t) for t in step["test_cases"]):
      return values
    if self.targets_h5:
      values = self._h5_values(problem, number, len(step["test_cases"]))
    if values is None and self.gold_targets and scicode_gold.gold_program(problem,
                                                                          number) is not None:
      values = self._gold_store().targets(problem, number)
    return values

  def _required(self, problem: Problem, step: Mapping[str, Any]) -> Sequence[Any] | None:
    """The step's target values; MissingTargetsError when a test needs one that is not there."""
    values = self._values(problem, step)
    for i, test in enumerate(step["test_cases"]):
      if (values is None or i >= len(values)) and _uses_target(test):
        raise MissingTargetsError(
            f"scicode problem {problem.id} step {step['step_number']}: test case {i} "
            f"compares against `target`, but no target value is available: {_OPTIONS}")
    return values

  def _tests(self, problem: Problem, step: Mapping[str, Any]) -> list[str]:
    values = self._required(problem, step)
    # strict_target (the harness's): the value's arrays refuse comparisons of another shape.
    return [f"target = strict_target({target_source(values[i])})\n{test}"
            if _uses_target(test) else test
            for i, test in enumerate(step["test_cases"])]

  def check_targets(self, problems: Sequence[Problem]) -> None:
    """Raises MissingTargetsError before a run when a step of `problems` compares against
    `target` and neither `targets`, `targets_h5` (read when the step is scored) nor gold code
    can give the values."""
    missing = [step_id(p.id, s["step_number"]) for p in problems for s in p.data["sub_steps"]
               if any(_uses_target(t) for t in s["test_cases"])
               and (self.targets or {}).get(s["step_number"]) is None and not self.targets_h5
               and not (self.gold_targets
                        and scicode_gold.gold_program(p, s["step_number"]) is not None)]
    if missing:
      shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
      raise MissingTargetsError(f"scicode: {len(missing)} steps compare against `target` with "
                                f"no target value available ({shown}): {_OPTIONS}")

  def _run(self, problem: Problem, step: Mapping[str, Any], program: str,
           tests: Sequence[str] | None = None, upstream: str | None = None, *,
           timeout_s: float | None = None, **kwargs) -> verifier.TestRun:
    """The step's test cases (`tests`: as `_tests` made them) against `program` (run after
    `upstream`, the earlier steps' code), in order in one namespace (as the official harness
    runs a step's script), with `scicode.compare` beside them. The tests run in the trusted
    harness after the problem's import lines; the functions they call run in the sandbox, the
    earlier steps' functions in a sandbox of their own that the program cannot patch."""
    tests = self._tests(problem, step) if tests is None else tests
    return verifier.run_tests(program, tests, timeout_s=timeout_s or self.timeout_s,
                              per_test_timeout_s=self.per_test_timeout_s,
                              per_test_wall_s=self.per_test_wall_s,
                              memory_mb=self.memory_mb, shared_namespace=True,
                              files=scicode_gold.support_files(step["test_cases"]),
                              prelude=problem.data["required_dependencies"], upstream=upstream,
                              **kwargs)

  @staticmethod
  def _step_passed(run: verifier.TestRun) -> bool:
    return not run.errors if run.total == 0 else run.passed == run.total

  def _upstream_code(self, problem: Problem, upstream: Mapping[str, str]) -> list[str]:
    order = [s["step_number"] for s in problem.data["sub_steps"]]
    ids = [i for i in order if i in upstream] + [i for i in upstream if i not in order]
    return [verifier.extract_code(upstream[i]) or upstream[i] for i in ids]

  def _every_step(self, problem: Problem, program: str) -> list[verifier.TestRun]:
    """The runs of every step that has tests (the others earn nothing of their own)."""
    steps = _tested(problem)
    for step in steps:  # missing targets raise here, before any sandbox call
      self._required(problem, step)
    workers = max(1, min(self.workers, len(steps)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      return list(pool.map(lambda step: self._run(problem, step, program), steps))

  def score_node(self, problem: Problem, node: Mapping[str, Any], artifact: str,
                 upstream: Mapping[str, str]) -> NodeScore:
    step = sub_step(problem, node["id"])
    # Missing targets raise whatever the artifact: a setup error, not a bad reply.
    tests = self._tests(problem, step) if step is not None else None
    if step is None:
      for each in problem.data["sub_steps"]:
        self._required(problem, each)
    checked = verifier.CodeCheck()(artifact)
    if not checked.ok:
      return NodeScore(0.0, False, {"reason": checked.reason})
    deps, earlier = problem.data["required_dependencies"], self._upstream_code(problem, upstream)
    if step is None:
      return self._score_whole(problem, "\n\n".join([deps, *earlier, checked.code]))
    if earlier:
      run = self._run(problem, step, checked.code, tests, "\n\n".join([deps, *earlier]))
    else:
      run = self._run(problem, step, "\n\n".join([deps, checked.code]), tests)
    details: dict[str, Any] = {"tests_passed": run.passed, "tests": run.total,
                               "isolation": run.isolation}
    if run.errors:
      details["reason"] = "; ".join(run.errors)[:1000]
    if run.total == 0:  # no tests: no reward of its own; flows on when its program runs
      details["untested"] = True
      return NodeScore(0.0, self._step_passed(run), details)
    if property_only(step):  # nothing to tell a solution from a constant: flows on, no reward
      details["property_only"] = True
      return NodeScore(0.0, run.passed == run.total, details)
    baseline = self.null_baseline(problem, step)
    details["null_baseline"] = baseline
    return NodeScore(reward_above_null(run.passed, run.total, baseline),
                     run.passed == run.total, details)

  def null_bodies(self, problem: Problem, step: Mapping[str, Any]) -> dict[str, str]:
    """The null programs measured on a step (`nulls.node_bodies`): the generic ones, each target
    of its tests and each literal they compare with as a constant, zeros / ones like them, and
    each earlier step's function called with the step's arguments."""
    values = self._required(problem, step) or ()
    targets = [values[i] for i, t in enumerate(step["test_cases"])
               if i < len(values) and _uses_target(t)]
    written = [v for t in step["test_cases"] for v in nulls.literals(t)]
    earlier = [n["title"] for n in problem.gold_graph[:_index(problem, step)]]
    return nulls.node_bodies(targets + written, earlier, source=target_source)

  def null_baseline(self, problem: Problem, step: Mapping[str, Any]) -> int:
    """The most of the step's tests one null program passes (`null_bodies`), measured through
    the harness after the gold code of the earlier steps (`nulls.measure`); read from the
    shipped measurements (`nulls.stored`) when their key matches, else measured once per
    process. A problem without gold code measures them after the imports alone (an earlier
    step's function is then missing), so the count of tests with equal targets (what one
    constant passes) is its floor."""
    tests, bodies, earlier, cache_key = self._null_setup(problem, step)
    deps, gold = problem.data["required_dependencies"], has_gold(problem)
    name = problem.gold_graph[_index(problem, step)]["title"]

    def measure() -> int:
      def run(program, copies, **kwargs):
        timeout = self.timeout_s * len(bodies)
        if earlier:
          return self._run(problem, step, program, copies, "\n\n".join([deps, *earlier]),
                           timeout_s=timeout, **kwargs)
        return self._run(problem, step, "\n\n".join([deps, program]), copies,
                         timeout_s=timeout, **kwargs)
      measured = max(nulls.measure(run, name, tests, bodies).values())
      return measured if gold else max(measured, self._equal_targets(problem, step))
    stored = nulls.stored(FAMILY, step_id(problem.id, step["step_number"]), cache_key)
    return stored if stored is not None else nulls.cached(cache_key, measure)

  def _null_setup(self, problem: Problem, step: Mapping[str, Any]):
    """(tests, null bodies, the earlier steps' gold code, the key of the measurement)."""
    tests, bodies = self._tests(problem, step), self.null_bodies(problem, step)
    earlier = [step_code(problem, n["id"]) for n in problem.gold_graph[:_index(problem, step)]
               ] if has_gold(problem) else []
    return tests, bodies, earlier, nulls.key(problem.data["required_dependencies"], tests,
                                             bodies, earlier)

  def null_key(self, problem: Problem, step: Mapping[str, Any]) -> str:
    """What a stored baseline of the step must have been measured under (`nulls.stored`)."""
    return self._null_setup(problem, step)[-1]

  def _equal_targets(self, problem: Problem, step: Mapping[str, Any]) -> int:
    """How many of the step's tests one constant passes by their targets alone: the largest
    group of tests that compare against equal targets (`base.null_baseline`)."""
    values = self._required(problem, step) or ()
    expected = [values[i] for i, t in enumerate(step["test_cases"])
                if i < len(values) and _uses_target(t)]
    return null_baseline(expected, same=_same_target)

  def rewarded(self, problem: Problem, step: Mapping[str, Any]) -> bool:
    """Whether the step can earn reward of its own: it has tests, one compares against a
    target, and no null program passes them all."""
    return (bool(step["test_cases"]) and not property_only(step)
            and self.null_baseline(problem, step) < len(step["test_cases"]))

  def _score_whole(self, problem: Problem, program: str) -> NodeScore:
    """A whole-problem node: reward = the share of the steps that earn reward of their own
    (`rewarded`) whose tests all pass; details count every tested step (the module docstring)."""
    runs = self._every_step(problem, program)
    flags = [self._step_passed(r) for r in runs]
    rewarded = [self.rewarded(problem, s) for s in _tested(problem)]
    details: dict[str, Any] = {"steps_passed": sum(flags), "steps": len(flags),
                               "isolation": runs[0].isolation if runs else ""}
    failed = [f"step {s['step_number']}: {'; '.join(r.errors) or 'failed'}"
              for s, r, ok in zip(_tested(problem), runs, flags) if not ok]
    if failed:
      details["reason"] = " | ".join(failed)[:1000]
    won = sum(f for f, r in zip(flags, rewarded) if r)
    return NodeScore(won / sum(rewarded) if any(rewarded) else 0.0, True, details)

  def score_problem(self, problem: Problem, artifacts: Mapping[str, str | None]) -> ProblemScore:
    """Each step re-scored in order, with the steps that passed before it as its upstream; for
    artifacts of whole-problem nodes (no key is a step number), every step run against their
    code joined in the order given."""
    if artifacts and all(sub_step(problem, k) is None for k in artifacts):
      codes = [c for c in map(_usable_code, artifacts.values()) if c is not None]
      flags = [False] * len(_tested(problem))
      if codes:
        program = "\n\n".join([problem.data["required_dependencies"], *codes])
        flags = [self._step_passed(r) for r in self._every_step(problem, program)]
      return self._problem_score(flags)
    passed: dict[str, str] = {}
    flags = []
    untested = {s["step_number"] for s in problem.data["sub_steps"] if not s["test_cases"]}
    for node in problem.gold_graph:
      artifact = artifacts.get(node["id"])
      ok = artifact is not None and self.score_node(problem, node, artifact, passed).passed
      if ok:
        passed[node["id"]] = artifact
      if node["id"] not in untested:  # counted through the steps that call it
        flags.append(ok)
    return self._problem_score(flags)

  @staticmethod
  def _problem_score(flags: Sequence[bool]) -> ProblemScore:
    k, n = sum(flags), len(flags)
    done = n > 0 and k == n
    return ProblemScore(done, {"steps_passed": float(k), "steps": float(n),
                               "step_pass": k / n if n else 0.0, "problem_pass": float(done)})
