"""SciCode test targets computed from the gold code, in the sandbox, cached on disk.

The official harness reads `target` from test_data.h5, which SciCode's authors made by running
each step's gold code on the test inputs. The 15 dev problems (problems_dev.jsonl) ship that gold
code (`ground_truth_code` per step), so their targets can be made the same way, without the file:

1. A test case is a few statements ending in an assert that compares an expression with
   `target`: `assert np.allclose(f(x), target)`, `assert cmp_tuple_or_list(f(x), target)`,
   `assert (f(x) > 0) == target`, or per item, `assert np.allclose(f(x)[0], target[0]) and ...`.
   `recording_snippet` reads the assert (AST), takes the expression `target` stands against
   (stripping accessors applied to both sides alike, such as `[0]`), and rewrites the test: that
   assert becomes `__target__ = <the expression>`, every other statement stays (a later test
   case of the step may use the names it binds: 10.x and 7.1 do).
2. `compute` runs, in ONE sandbox call per step, the program the verifier would build (the
   required imports, the gold code of the earlier steps and of this step) and then the step's
   rewritten tests in order in one copy of its namespace, as the official harness runs a step's
   script; each `__target__` comes back as tagged JSON (`scicode_values`), so nothing from the
   sandbox is unpickled or executed here.
3. `GoldTargets` caches the values in memory and on disk, one gzip JSON file per step, named by
   the step and a hash of everything the values depend on (imports, gold code up to the step, the
   step's test cases, this format): a changed problem file gets new entries, never stale ones.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import logging
import os
import re
import secrets
import tempfile
import threading
from typing import Any, Mapping, Sequence

from morse_jax.execution import sandbox
from morse_jax.execution import verifier
from morse_jax.tasks import scicode_values
from morse_jax.tasks.base import Problem

DEFAULT_CACHE = "~/.cache/morse_jax/scicode_targets"
_VALUES_MODULE = "_scicode_values"  # scicode_values.py under this name inside the sandbox
_RESULT = "__target__"


class GoldTargetsError(ValueError):
  """Targets cannot be computed: no gold code, an unreadable test, or the gold run failed."""


def _uses_target(node: ast.AST) -> bool:
  return any(isinstance(n, ast.Name) and n.id == "target" for n in ast.walk(node))


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
  return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _same(a: Any, b: Any) -> bool:
  return ast.dump(a) == ast.dump(b)


def _accessors(node: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> tuple[ast.AST, list]:
  """Climbs from `target` through `[...]`, `.attr` and calls on it: (outermost, accessors)."""
  chain = []
  while True:
    up = parents.get(node)
    if ((isinstance(up, (ast.Subscript, ast.Attribute)) and up.value is node)
        or (isinstance(up, ast.Call) and up.func is node)):
      chain.append(up)
      node = up
    else:
      return node, chain


def _strip(partner: ast.AST, chain: Sequence[ast.AST]) -> ast.AST | None:
  """`partner` with the accessors of `chain` (outermost first) removed, or None when it does not
  carry the same accessors."""
  for wrap in reversed(chain):
    if type(partner) is not type(wrap):
      return None
    if isinstance(wrap, ast.Subscript):
      if not _same(partner.slice, wrap.slice):
        return None
      partner = partner.value
    elif isinstance(wrap, ast.Attribute):
      if partner.attr != wrap.attr:
        return None
      partner = partner.value
    else:
      if not (all(map(_same, partner.args, wrap.args)) and len(partner.args) == len(wrap.args)
              and all(map(_same, partner.keywords, wrap.keywords))
              and len(partner.keywords) == len(wrap.keywords)):
        return None
      partner = partner.func
  return partner


def _partner(use: ast.Name, parents: Mapping[ast.AST, ast.AST]) -> ast.AST:
  """The expression one use of `target` is compared with."""
  top, chain = _accessors(use, parents)
  site = parents.get(top)
  other = None
  if isinstance(site, ast.Call) and top in site.args and len(site.args) == 2:
    other = site.args[1 - site.args.index(top)]  # np.allclose(x, target), cmp(x, target), ...
  elif (isinstance(site, ast.Compare) and len(site.ops) == 1
        and isinstance(site.ops[0], (ast.Eq, ast.Is))):
    other = site.comparators[0] if site.left is top else site.left
  if other is None:
    raise GoldTargetsError(f"`target` is used in `{ast.unparse(site or top)}`, not as one side "
                           "of a comparison call (f(x, target)) or of ==")
  stripped = _strip(other, chain)
  if stripped is None or _uses_target(stripped):
    raise GoldTargetsError(f"`{ast.unparse(top)}` is compared with `{ast.unparse(other)}`, "
                           "which does not apply the same accessors to one expression")
  return stripped


def recording_snippet(test: str) -> str | None:
  """The test with each assert that uses `target` replaced by `__target__ = <what target stands
  for>` (see the module docstring), every other statement kept (later test cases of the step may
  use the names they bind); None when the test does not use `target`. GoldTargetsError when a use
  of `target` is not one this can read, or two asserts compare it with different expressions."""
  try:
    tree = verifier.parse(test)
  except SyntaxError as e:
    raise GoldTargetsError(f"test case does not parse: {e}") from e
  body, found = [], []
  for stmt in tree.body:
    if not _uses_target(stmt):
      body.append(stmt)
      continue
    if not isinstance(stmt, ast.Assert):
      raise GoldTargetsError(f"`target` is used in a {type(stmt).__name__} statement "
                             f"(`{ast.unparse(stmt)[:120]}`), not in an assert")
    parents = _parents(stmt)
    uses = [n for n in ast.walk(stmt.test) if isinstance(n, ast.Name) and n.id == "target"]
    found += [_partner(u, parents) for u in uses]
    body.append(ast.parse(f"{_RESULT} = ({ast.unparse(found[-1])})").body[0])
  if not found:
    return None
  if any(not _same(f, found[0]) for f in found[1:]):
    raise GoldTargetsError("the uses of `target` stand against different expressions: "
                           + ", ".join(sorted({f"`{ast.unparse(f)[:80]}`" for f in found})))
  return ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"


def gold_program(problem: Problem, step_number: str) -> str | None:
  """The required imports and the gold code of every step up to and including `step_number`, as
  the verifier lays out a program; None when one of those steps has no gold code."""
  codes = []
  for step in problem.data["sub_steps"]:
    code = step.get("ground_truth_code")
    if not code:
      return None
    codes.append(code)
    if step["step_number"] == str(step_number):
      return "\n\n".join([problem.data["required_dependencies"], *codes])
  raise GoldTargetsError(f"scicode problem {problem.id}: no sub-step {step_number!r}")


def support_files(tests: Sequence[str]) -> dict[str, str]:
  """`scicode.compare` (which official tests import) from the installed nvidia-scicode, as files
  for the sandbox, when a test imports it; the sandbox's interpreter does not have the package."""
  if not any("scicode" in t for t in tests):
    return {}
  spec = importlib.util.find_spec("scicode")  # finds the package without importing it
  if spec is None or not spec.submodule_search_locations:
    return {}
  path = os.path.join(list(spec.submodule_search_locations)[0], "compare", "cmp.py")
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    source = f.read()
  return {"scicode/__init__.py": "", "scicode/compare/__init__.py": "",
          "scicode/compare/cmp.py": source}


# Runs in the sandbox: the gold program as module `solution`, then the step's test cases in order
# in one copy of its namespace (tests that do not use `target` run as they are: later ones may
# need their names); the results go to a duplicate of stdout behind a random marker.
_HARNESS = r'''
import json as _json, os as _os, sys as _sys, types as _types
def _main(marker, program, snippets):
  import _scicode_values
  out = _os.dup(1)
  _os.dup2(_os.open(_os.devnull, _os.O_WRONLY), 1)
  def fail(e):
    return f"{type(e).__name__}: {e}"[:500]
  module = _types.ModuleType("solution")
  module.__file__ = "solution.py"
  _sys.modules["solution"] = module
  results, program_error = [], None
  try:
    exec(compile(program, "solution.py", "exec"), module.__dict__)
  except BaseException as e:
    program_error = fail(e)
  space = dict(module.__dict__)  # one namespace, in order, as the official harness runs a step
  for i, snippet in enumerate(snippets):
    if program_error is not None:
      results.append(None)
      continue
    space.pop("__target__", None)
    try:
      exec(compile(snippet, f"test_{i}", "exec"), space)
      results.append({"value": _scicode_values.encode(space["__target__"])}
                     if "__target__" in space else None)
    except BaseException as e:
      results.append({"error": fail(e)})
  summary = _json.dumps({"results": results, "program_error": program_error})
  _os.write(out, ("\n" + marker + summary + "\n").encode())
  _os._exit(0)
'''


def _values_source() -> str:
  with open(scicode_values.__file__, encoding="utf-8") as f:
    return f.read()


def compute(problem: Problem, step_number: str, *, timeout_s: float = 600.0,
            memory_mb: int = 4096) -> list[Any]:
  """Runs the gold code of `step_number` on its test cases in the sandbox: one value per test
  case (None for tests that do not use `target`)."""
  where = f"scicode problem {problem.id} step {step_number}"
  program = gold_program(problem, step_number)
  if program is None:
    raise GoldTargetsError(f"{where}: a step up to this one has no ground_truth_code (only the "
                           "dev problems, problems_dev.jsonl, ship gold code)")
  step = next(s for s in problem.data["sub_steps"] if s["step_number"] == str(step_number))
  snippets = []
  for i, test in enumerate(step["test_cases"]):
    try:
      snippets.append(recording_snippet(test))
    except GoldTargetsError as e:
      raise GoldTargetsError(f"{where}: test case {i}: {e}") from e
  if all(s is None for s in snippets):
    return [None] * len(snippets)
  marker = f"@@GOLD-{secrets.token_hex(8)}@@"
  # Tests without `target` run as written: they may bind names that later tests use.
  runs = [s if s is not None else t for s, t in zip(snippets, step["test_cases"])]
  source = _HARNESS + f"_main({marker!r}, {program!r}, {runs!r})\n"
  files = {f"{_VALUES_MODULE}.py": _values_source(), **support_files(step["test_cases"])}
  res = sandbox.run_python(source, timeout_s=timeout_s, memory_mb=memory_mb,
                           max_output_bytes=1 << 30, files=files)
  lines = [line for line in res.stdout.splitlines() if line.startswith(marker)]
  if not lines:
    why = (f"timed out after {timeout_s} s" if res.timed_out else
           "its output was cut" if res.truncated else
           f"exit code {res.returncode}: {res.stderr.strip()[-500:]}")
    raise GoldTargetsError(f"{where}: the gold run gave no result ({why})")
  summary = json.loads(lines[-1][len(marker):])
  if summary["program_error"]:
    raise GoldTargetsError(f"{where}: the gold code raised {summary['program_error']}")
  values = []
  for i, (result, snippet) in enumerate(zip(summary["results"], snippets)):
    if snippet is None:  # the test needs no target; its own asserts are not ours to judge
      values.append(None)
    elif result is None:
      raise GoldTargetsError(f"{where}: test case {i}: the gold run stored no value")
    elif "error" in result:
      raise GoldTargetsError(f"{where}: test case {i}: the gold code raised {result['error']}")
    else:
      values.append(scicode_values.decode(result["value"]))
  return values


def cache_key(problem: Problem, step_number: str) -> str:
  """A hash of everything the step's targets depend on."""
  step = next(s for s in problem.data["sub_steps"] if s["step_number"] == str(step_number))
  blob = json.dumps({"format": scicode_values.FORMAT, "problem": problem.id,
                     "step": str(step_number), "program": gold_program(problem, step_number),
                     "tests": step["test_cases"]}, sort_keys=True)
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class GoldTargets:
  """Computed targets of the steps with gold code, cached in memory and under `cache_dir`
  (None: memory only). Thread-safe; a step is computed at most once per process, different
  steps at the same time."""

  def __init__(self, cache_dir: str | None = DEFAULT_CACHE, *, timeout_s: float = 600.0,
               memory_mb: int = 4096):
    self.cache_dir = os.path.expanduser(cache_dir) if cache_dir else None
    self.timeout_s, self.memory_mb = timeout_s, memory_mb
    self._values: dict[tuple[str, str], list[Any]] = {}
    self._lock = threading.Lock()  # guards _steps
    self._steps: dict[tuple[str, str], threading.Lock] = {}  # one lock per step

  def __getstate__(self) -> dict[str, Any]:  # a lock cannot be pickled or deep-copied
    return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_steps")}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._lock, self._steps = threading.Lock(), {}

  def path(self, problem: Problem, step_number: str) -> str | None:
    if self.cache_dir is None:
      return None
    name = re.sub(r"[^\w.-]", "_", f"{problem.id}-{step_number}")
    return os.path.join(self.cache_dir, f"{name}-{cache_key(problem, step_number)[:20]}.json.gz")

  def targets(self, problem: Problem, step_number: str) -> list[Any]:
    key = (problem.id, str(step_number))
    with self._lock:
      step_lock = self._steps.setdefault(key, threading.Lock())
    with step_lock:
      if key not in self._values:
        values = self._read(problem, step_number)
        if values is None:
          values = compute(problem, step_number, timeout_s=self.timeout_s,
                           memory_mb=self.memory_mb)
          self._write(problem, step_number, values)
        self._values[key] = values
      return self._values[key]

  def _read(self, problem: Problem, step_number: str) -> list[Any] | None:
    path = self.path(problem, step_number)
    if path is None or not os.path.exists(path):
      return None
    try:
      with gzip.open(path, "rt", encoding="utf-8") as f:
        stored = json.load(f)
      if stored.get("key") != cache_key(problem, step_number):
        raise ValueError("the key does not match")
      return [scicode_values.decode(v["value"]) for v in stored["targets"]]
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
      logging.warning("scicode targets cache %s is unreadable (%s); computing again", path, e)
      return None

  def _write(self, problem: Problem, step_number: str, values: Sequence[Any]) -> None:
    path = self.path(problem, step_number)
    if path is None:
      return
    stored = {"format": scicode_values.FORMAT, "problem_id": problem.id,
              "step": str(step_number), "key": cache_key(problem, step_number),
              "targets": [{"value": scicode_values.encode(v)} for v in values]}
    os.makedirs(self.cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".tmp")
    try:
      with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as f:
        f.write(json.dumps(stored).encode("utf-8"))
      os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache holds nothing private
      os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise
