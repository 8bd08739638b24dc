"""Programs that compute nothing, and the baseline they set: what a node's tests give away.

A null program defines the function a node asks for (any signature: `*args, **kwargs`) with a
body that does no work. The generic ones (`BODIES`, `AT_IMPORT`) return a constant, an empty
container, empty numpy arrays of 1-7 dimensions (shape (0, 1, ..., 1)) or a tuple of them, the
first input unchanged, raise, exit (at import or in the call) or sleep past the time limit. Each
node adds its own (`node_bodies`): every target of its tests as a constant, zeros and ones of
each target's structure (shape, length, keys), and each parent's result unchanged (a parent's
function called with the node's arguments: the cheapest program a policy can write when the
prompt names the parents).

The baseline of a node is measured, not inferred: the most tests of the node that one null
program passes when run through the same harness as the reply (`measure`). A family's reward is
the share of tests passed beyond it (`base.reward_above_null`), so no null program earns reward.
All null programs of a node run in one harness call: each is defined under its own name
(`<function>__null<k>`) and the node's tests run once per null program with the function's name
rewritten to it, each copy in a namespace of its own (`verifier.run_tests(groups=)`). The ones
that end or stall the program (`ENDING`) cannot pass a test and would take the call down with
them; the sweep (`benchmarks.null_sweep`) runs them one by one instead.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.resources
import json
import os
import threading
import textwrap
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from morse_jax import atomic
from morse_jax.execution import verifier

_EMPTY = "__import__('numpy').empty({shape})"


def _empty(dims: int) -> str:
  return _EMPTY.format(shape=(0,) + (1,) * (dims - 1))


# name -> the function's body (source, may use `args` / `kwargs`).
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
# They end or stall the program, so they pass no test; in one shared call they would end it.
ENDING: tuple[str, ...] = ("exit(0) in the call", "os._exit(0) in the call",
                           "sleep past the limit", *AT_IMPORT)
MEASURED: dict[str, str] = {k: v for k, v in BODIES.items() if k not in ENDING}
# Bump when the set of null programs or the way they are measured changes: cached baselines
# (`morse_jax/tasks/data/null_baselines.json`, disk caches) carry it in their key.
VERSION = "nulls/1"


def function(name: str, null: str) -> str:
  """The code of the generic null program `null` (one of `NAMES`) defining `name`."""
  if null in AT_IMPORT:
    return f"{AT_IMPORT[null]}\n\n{define(name, 'return 0')}"
  if null not in BODIES:
    raise ValueError(f"nulls: null={null!r}; expected one of {list(NAMES)}")
  return define(name, BODIES[null])


def define(name: str, body: str) -> str:
  """A function `name(*args, **kwargs)` with the body `body` (source)."""
  return f"def {name}(*args, **kwargs):\n{textwrap.indent(body, '    ')}\n"


def reply(name: str, null: str | None = None, *, body: str | None = None) -> str:
  """A null program as an executor's reply (one ```python block): the generic `null`, or a
  function with `body`."""
  code = function(name, null) if body is None else define(name, body)
  return f"```python\n{code}```\n"


def script(null: str | None = None, *, body: str | None = None) -> str:
  """A null SRDD program: the null body in `main()`, which the script calls."""
  return reply("main", null, body=body).replace(
      "```\n", "\nif __name__ == '__main__':\n    main()\n```\n")


def _filled(value: Any, fill: int) -> Any:
  """`value` with every number replaced by `fill`, keeping its structure: the arrays' shapes and
  dtypes, the lists' and tuples' lengths, the dicts' keys; None where a part has no such form."""
  if isinstance(value, (bool, np.bool_)):
    return bool(fill)
  if isinstance(value, np.ndarray):
    return np.full(value.shape, fill, dtype=value.dtype) if value.dtype.kind in "biufc" else None
  if isinstance(value, np.generic):
    return value.dtype.type(fill) if value.dtype.kind in "biufc" else None
  if isinstance(value, (int, float, complex)):
    return type(value)(fill)
  if isinstance(value, (list, tuple)):
    items = [_filled(v, fill) for v in value]
    if any(i is None for i in items):
      return None
    return items if isinstance(value, list) else tuple(items)
  if isinstance(value, dict):
    items = {k: _filled(v, fill) for k, v in value.items()}
    return None if any(v is None for v in items.values()) else items
  return None


def value_bodies(values: Sequence[Any], source: Callable[[Any], str] = repr) -> dict[str, str]:
  """Null bodies from a node's target values: each target as a constant, and zeros and ones of
  each target's structure. `source` writes a value as Python source (`scicode.target_source`
  for numpy arrays and friends)."""
  out: dict[str, str] = {}
  for i, value in enumerate(values):
    out[f"return target {i}"] = f"return {source(value)}"
    for fill, label in ((0, "zeros"), (1, "ones")):
      filled = _filled(value, fill)
      if filled is not None:
        out[f"return {label} like target {i}"] = f"return {source(filled)}"
  return out


# Comparisons a test makes by calling a function (numpy's, SciCode's `cmp_tuple_or_list`).
COMPARISONS = frozenset({"isclose", "allclose", "array_equal", "array_almost_equal",
                         "assert_allclose", "assert_array_equal", "assert_almost_equal",
                         "assert_array_almost_equal", "assert_equal", "cmp_tuple_or_list"})


def literals(test: str, assigned: bool = True) -> list[Any]:
  """The literal values a test compares answers with (`f(x) == [1, 2]`, `np.isclose(f(x),
  0.2)`) and, with `assigned`, binds to a name it may compare with later (`ref1 = -1.74756`,
  SciCode 10.11), in order, each once: the constants a reply that copies its answers would
  return."""
  try:
    tree = verifier.parse(test)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return []
  out: list[Any] = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
    elif isinstance(node, ast.Assign) and assigned:
      operands = [node.value]
    elif isinstance(node, ast.Call) and (getattr(node.func, "attr", None) in COMPARISONS
                                         or getattr(node.func, "id", None) in COMPARISONS):
      operands = node.args
    else:
      continue
    for operand in operands:
      if isinstance(operand, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
        continue  # not a literal: skip without evaluating
      try:
        value = ast.literal_eval(operand)
      except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        continue
      if not any(type(v) is type(value) and v == value for v in out):
        out.append(value)
  return out


def parent_bodies(parents: Sequence[str]) -> dict[str, str]:
  """Null bodies that hand back a parent's result: the parent's function called with the node's
  own arguments."""
  return {f"return {p}(...)": f"return {p}(*args, **kwargs)" for p in parents}


def node_bodies(values: Sequence[Any], parents: Sequence[str],
                source: Callable[[Any], str] = repr) -> dict[str, str]:
  """Every measured null body of one node, the generic ones first, equal bodies once."""
  out, seen = {}, set()
  for name, body in {**MEASURED, **value_bodies(values, source), **parent_bodies(parents)}.items():
    if body not in seen:
      seen.add(body)
      out[name] = body
  return out


def rename(test: str, old: str, new: str) -> str:
  """`test` with every use of the name `old` (a variable, not an attribute or a keyword) written
  `new`; the rest of the text as it was."""
  tree = verifier.parse(test)
  spots = sorted(((n.lineno, n.col_offset) for n in ast.walk(tree)
                  if isinstance(n, ast.Name) and n.id == old), reverse=True)
  lines = test.splitlines(keepends=True)
  for line, col in spots:  # from the end, so earlier offsets stay valid
    text = lines[line - 1].encode()  # col_offset counts UTF-8 bytes
    lines[line - 1] = (text[:col] + new.encode() + text[col + len(old.encode()):]).decode()
  return "".join(lines)


def variant(name: str, k: int) -> str:
  return f"{name}__null{k}"


class NullBaselineError(RuntimeError):
  """The harness gave no result for a node's null programs (the sandbox or harness failed)."""


Run = Callable[..., verifier.TestRun]  # (program, tests, groups=, remote=) -> TestRun


def measure(run: Run, name: str, tests: Sequence[str], bodies: Mapping[str, str], *,
            remote: bool = False) -> dict[str, int]:
  """How many of `tests` each null body passes as the function `name`: one harness call through
  `run` (the family's own runner, after the same prelude and upstream code as a reply), the tests
  once per body in a namespace of their own. `remote`: name the variants as the remote names (a
  family that passes `remote=[name]`). A test that does not parse is passed by none."""
  names = list(bodies)
  program = "\n".join(define(variant(name, k), bodies[n]) for k, n in enumerate(names))
  copies, groups = [], []
  for k in range(len(names)):
    for test in tests:
      try:
        copies.append(rename(test, name, variant(name, k)))
      except (SyntaxError, ValueError, RecursionError, MemoryError):
        copies.append("raise SyntaxError('the test does not parse')")
      groups.append(k)
  extra = {"remote": [variant(name, k) for k in range(len(names))]} if remote else {}
  result = run(program, copies, groups=groups, **extra)
  if len(result.flags) != len(copies):  # no summary: a baseline of 0 would be a guess
    raise NullBaselineError(f"the null programs of {name!r} could not be measured: "
                            f"{'; '.join(result.errors)[:300]}")
  flags, n = result.flags, len(tests)
  return {names[k]: sum(flags[k * n:(k + 1) * n]) for k in range(len(names))}


def key(*parts: Any) -> str:
  """A cache key for a measured baseline: VERSION and whatever decides it (tests, bodies,
  upstream code), hashed."""
  text = json.dumps([VERSION, *parts], sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


_MEMO: dict[str, int] = {}
_MEMO_LOCK = threading.Lock()
# Measured baselines on disk, one small file per key: a node measured by one run (0.1-0.5 s of
# sandbox time each; a demo's training set holds hundreds) is read by the next. The key holds
# everything the value depends on, so a stale file cannot be read.
CACHE_DIR = os.environ.get("MORSE_NULLS_CACHE", "~/.cache/morse_jax/null_baselines")


def _disk(cache_key: str) -> str:
  return os.path.join(os.path.expanduser(CACHE_DIR), f"{cache_key}.json")


def cached(cache_key: str, compute: Callable[[], int]) -> int:
  """`compute()` once per key: kept in this process (a node's baseline is scored again for every
  candidate; two threads may both compute a new key, and agree) and on disk (`CACHE_DIR`; an
  unreadable or damaged file is measured again and rewritten)."""
  with _MEMO_LOCK:
    if cache_key in _MEMO:
      return _MEMO[cache_key]
  try:
    with open(_disk(cache_key), encoding="utf-8") as f:
      value = json.load(f)["baseline"]
    if type(value) is not int or value < 0:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"baseline {value!r}")
  except (OSError, ValueError, KeyError, TypeError):
    value = compute()
    try:
      os.makedirs(os.path.dirname(_disk(cache_key)), exist_ok=True)
      atomic.write_text(_disk(cache_key), json.dumps({"baseline": value, "version": VERSION}))
    except OSError:
      pass  # a read-only home: measured again next time
  with _MEMO_LOCK:
    _MEMO[cache_key] = value
  return value


DATA = "null_baselines.json"  # in morse_jax/tasks/data: the shipped families' measurements
_STORED: dict[str, dict] | None = None


def _stored_data() -> dict[str, dict]:
  global _STORED  # pylint: disable=global-statement
  with _MEMO_LOCK:
    if _STORED is None:
      path = importlib.resources.files("morse_jax.tasks") / "data" / DATA
      _STORED = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return _STORED


def stored(family: str, item: str, cache_key: str) -> int | None:
  """A shipped baseline (`benchmarks.null_baselines` measures and writes them) of `item` (a
  SciCode step id, a HumanEval task id) when it was measured under the same key (same tests,
  targets, null programs and upstream code), else None."""
  entry = _stored_data().get(family, {}).get(item)
  return entry["baseline"] if entry and entry.get("key") == cache_key else None
