"""Strict comparisons for the trusted test harness: an answer equals a target only when it has
the target's structure.

numpy's comparisons broadcast: `np.allclose(np.empty((0, 1, 1)), t)` and
`(np.empty((0, 1)) == t).all()` are True for any `t`, `np.allclose([], 5.0)` is True, and `zip`
stops at the shorter side, so `all(... for a, b in zip((), target))` is True. A program that
computes nothing would pass such tests. This module, loaded into `harness.py` for every task
family, closes those holes:

- `answer(value)`: the arrays in a decoded answer (inside lists, tuples, dicts too) become
  `Answer` arrays, whose ufuncs (`==`, `-`, `<`, ...) refuse an operand of another shape unless
  it is a scalar (and the array is not empty), and a reduction (`.any()`, `.all()`, ...) of an
  empty answer alone raises;
- `target(value)`: the same for a test's expected value, as `Target` arrays, which also refuse a
  scalar against a non-scalar target in `==` / `!=`;
- `patch_numpy()`: numpy's comparison functions (allclose, isclose, array_equal, array_equiv,
  the numpy.testing asserts) in strict versions: shapes equal and dtype kinds of one class (bool,
  number, text, other) before any tolerance (allclose / isclose: or a scalar against a non-empty
  array that is no Target, as in a test's `np.isclose(x, 0)`); NaN equals only NaN at the same
  place;
- `test_builtins()`: the builtins the tests run with, with a `zip` that refuses unequal lengths.

Refusals raise StrictComparisonError (a ValueError); the strict functions return False where
numpy's return a bool. Self-contained (stdlib; numpy imported only by `patch_numpy`, and only
when the harness has it), since the harness runs with -I and without the project on sys.path:
the verifier ships this file's source in the job.
"""

import builtins

_EQUALITY = ("equal", "not_equal")
_KIND_CLASS = {"b": "bool", "i": "number", "u": "number", "f": "number", "c": "number",
               "U": "text", "S": "text"}
_state = {"np": None, "answer": None, "target": None, "original": {}}


class StrictComparisonError(ValueError):
  """An answer compared with a value of another structure (shape, length, kind)."""


def _shape(np, x):
  try:
    return np.shape(x)
  except (ValueError, TypeError):
    return None  # ragged: numpy's own comparison raises on it


def _kind(np, x):
  try:
    kind = np.asarray(x).dtype.kind
  except (ValueError, TypeError):
    return None
  return _KIND_CLASS.get(kind, kind)


def _refuse_mismatch(np, ufunc, inputs):
  """The shape rule of Answer / Target operands in one ufunc call."""
  shapes = [_shape(np, x) for x in inputs]
  strict = [i for i, x in enumerate(inputs) if isinstance(x, _state["answer"] or ())
            or isinstance(x, _state["target"] or ())]
  for i in strict:
    mine = shapes[i]
    for j, other in enumerate(shapes):
      if j == i or other == mine:
        continue
      scalar = other == ()
      if scalar and not (isinstance(inputs[i], _state["target"]) and ufunc.__name__ in _EQUALITY
                         and mine != ()) and 0 not in mine:
        continue
      raise StrictComparisonError(
          f"{ufunc.__name__}: operand of shape {other} against an answer or target of shape "
          f"{mine}; the verifier compares values of equal shape only")


def _classes(np):
  """Answer and Target, made once numpy is imported."""

  class _Strict(np.ndarray):
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
      if method == "__call__" and len(inputs) > 1:
        _refuse_mismatch(np, ufunc, inputs)
      if (method == "reduce" and isinstance(inputs[0], _state["answer"])
          and inputs[0].size == 0):  # `not np.isnan(answer).any()` holds for any empty answer
        raise StrictComparisonError(f"{ufunc.__name__}.reduce over an empty answer checks nothing")
      plain = [np.asarray(x) if isinstance(x, _Strict) else x for x in inputs]
      if out is not None:
        kwargs["out"] = tuple(np.asarray(o) if isinstance(o, _Strict) else o for o in out)
      result = getattr(ufunc, method)(*plain, **kwargs)
      # Against a Target (shapes already checked) the result is the test's own verdict.
      cls = (_state["target"] if any(isinstance(x, _state["target"]) for x in inputs)
             else _state["answer"])
      if isinstance(result, tuple):
        return tuple(_view(np, r, cls) for r in result)
      return _view(np, result, cls)

  class Answer(_Strict):
    """An array decoded from the tested program's answer."""

  class Target(_Strict):
    """An array a test expects."""

  return Answer, Target


def _view(np, x, cls):
  return x.view(cls) if type(x) is np.ndarray else x  # pylint: disable=unidiomatic-typecheck


def _mark(value, cls, depth=0):
  np = _state["np"]
  if np is None or depth > 200:
    return value
  t = type(value)
  if t is np.ndarray:
    return value.view(cls)
  if t is list:
    return [_mark(v, cls, depth + 1) for v in value]
  if t is tuple:
    return tuple(_mark(v, cls, depth + 1) for v in value)
  if t is dict:
    return {k: _mark(v, cls, depth + 1) for k, v in value.items()}
  return value


def answer(value):
  """`value` (decoded from the program) with its arrays as Answer arrays."""
  patch_numpy()
  return _mark(value, _state["answer"])


def target(value):
  """`value` (what a test expects) with its arrays as Target arrays."""
  patch_numpy()
  return _mark(value, _state["target"])


def _structure_error(np, a, b, scalar_ok=False):
  """Why a cannot equal b by structure, or None. `scalar_ok`: a scalar against a non-empty array
  that is no Target is fine (a test's `np.isclose(x, 0)`)."""
  sa, sb = _shape(np, a), _shape(np, b)
  if sa is None or sb is None:
    return None
  target = _state["target"]
  if scalar_ok and ((sa == () and 0 not in sb and not isinstance(b, target))
                    or (sb == () and 0 not in sa and not isinstance(a, target))):
    sa = sb
  if sa != sb:
    return f"shape {sa} against shape {sb}"
  ka, kb = _kind(np, a), _kind(np, b)
  if ka != kb:
    return f"values of kind {ka} against values of kind {kb}"
  return None


def _strict_functions(np, original):
  def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=True):
    why = _structure_error(np, a, b, scalar_ok=True)
    if why:
      raise StrictComparisonError(f"isclose: {why}")
    return original["isclose"](np.asarray(a), np.asarray(b), rtol=rtol, atol=atol,
                               equal_nan=equal_nan)

  def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=True):
    if _structure_error(np, a, b, scalar_ok=True):
      return False
    return bool(original["allclose"](np.asarray(a), np.asarray(b), rtol=rtol, atol=atol,
                                     equal_nan=equal_nan))

  def array_equal(a1, a2, equal_nan=False):
    if _structure_error(np, a1, a2):
      return False
    return bool(original["array_equal"](np.asarray(a1), np.asarray(a2), equal_nan=equal_nan))

  def array_equiv(a1, a2):
    return array_equal(a1, a2)

  def testing(name):
    def check(actual, desired, *args, **kwargs):
      why = _structure_error(np, actual, desired)
      if why:
        raise AssertionError(f"{name}: {why}")
      return original[name](actual, desired, *args, **kwargs)
    return check

  found = {"isclose": isclose, "allclose": allclose, "array_equal": array_equal,
           "array_equiv": array_equiv}
  for name in ("assert_allclose", "assert_array_equal", "assert_array_almost_equal",
               "assert_almost_equal", "assert_equal"):
    found[name] = testing(name)
  return found


def patch_numpy():
  """Once numpy is imported (by the harness or a test): Answer / Target made, numpy's
  comparison functions replaced by strict ones. A no-op before that and after the first time."""
  import sys  # pylint: disable=import-outside-toplevel
  np = sys.modules.get("numpy")
  if np is None or _state["np"] is not None:
    return
  import numpy.testing  # pylint: disable=import-outside-toplevel,redefined-outer-name
  original = {n: getattr(np, n) for n in ("isclose", "allclose", "array_equal", "array_equiv")}
  for name in ("assert_allclose", "assert_array_equal", "assert_array_almost_equal",
               "assert_almost_equal", "assert_equal"):
    original[name] = getattr(np.testing, name)
  _state["answer"], _state["target"] = _classes(np)
  _state["original"] = original
  _state["np"] = np
  for name, fn in _strict_functions(np, original).items():
    setattr(np.testing if name.startswith("assert_") else np, name, fn)


def _zip(*iterables, strict=True):
  """zip that refuses iterables of unequal length (`strict=False` to truncate on purpose)."""
  return builtins.zip(*iterables, strict=strict)


def test_builtins():
  """The builtins of the tests' namespace: the real ones, with a strict zip."""
  found = dict(vars(builtins))
  found["zip"] = _zip
  return found
