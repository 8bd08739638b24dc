"""Null programs and the baseline they set, measured through the harness (`tasks.nulls`)."""

from __future__ import annotations

import numpy as np
import pytest

from morse_jax.execution import verifier
from morse_jax.tasks import nulls, scicode

PARENT = "def parent(xs):\n    return sorted(xs)\n"
# f(xs) = sorted(xs) without its first element; answers by test: [], [], [2], [2, 3], [5, 9]
TESTS = ["assert f([]) == []", "assert f([7]) == []", "assert f([2, 1]) == [2]",
         "assert f([3, 1, 2]) == [2, 3]", "assert f([9, 5, 1]) == [5, 9]"]


def _run(program, tests, **kwargs):
  return verifier.run_tests(PARENT + "\n" + program, tests, timeout_s=60.0,
                            per_test_timeout_s=2.0, **kwargs)


def test_measure_counts_what_each_null_program_passes():
  """Counted by hand: `return []` and each [] target pass tests 0-1; the input unchanged passes
  test 0; the parent's result passes test 0 only; `[2, 3]` as a constant passes test 3; zeros
  like it none. The baseline is the most: 2."""
  values = [[], [], [2], [2, 3], [5, 9]]
  bodies = nulls.node_bodies(values, ["parent"])
  passed = nulls.measure(_run, "f", TESTS, bodies)
  assert passed["return []"] == 2
  assert passed["return the first input"] == 1
  assert passed["return parent(...)"] == 1
  assert passed["return target 3"] == 1 and passed["return zeros like target 3"] == 0
  assert passed["return 0"] == passed["raise"] == 0
  assert "return target 0" not in passed  # the same body as `return []`: measured once
  assert max(passed.values()) == 2


def test_a_parent_that_already_answers_is_counted():
  """The probe's cheapest program: a node whose answer its parent's function gives (here on 4 of
  5 tests) has that as its baseline."""
  tests = ["assert f([]) == []", "assert f([2, 1]) == [1, 2]", "assert f([3, 1]) == [1, 3]",
           "assert f([5, 4]) == [4, 5]", "assert f([1, 1]) == [1]"]
  passed = nulls.measure(_run, "f", tests, nulls.node_bodies([], ["parent"]))
  assert passed["return parent(...)"] == 4 and max(passed.values()) == 4


def test_each_copy_of_the_tests_gets_its_own_namespace():
  """Shared-namespace tests (SciCode's) run once per null program: a name bound by one copy's
  test is not seen by the next copy's, as it would not be in a run of that program alone (one
  namespace for all copies gave `return 1` both tests)."""
  tests = ["if f(1) == 0:\n    seen = True", "assert seen"]
  passed = nulls.measure(lambda program, copies, **kw: _run(program, copies,
                                                             shared_namespace=True, **kw),
                         "f", tests, {"return 0": "return 0", "return 1": "return 1"})
  assert passed == {"return 0": 2, "return 1": 1}


def test_a_failed_measurement_raises():
  with pytest.raises(nulls.NullBaselineError, match="could not be measured"):
    nulls.measure(lambda program, copies, **kw: verifier.TestRun(0, len(copies), ["boom"]),
                  "f", TESTS, {"return 0": "return 0"})


def test_rename_touches_only_the_name():
  test = ("x = f(1)  # f stays in comments\nassert g.f == 'f' and h(f=2) == f\n"
          "é = f(é)\n")
  assert nulls.rename(test, "f", "f__null3") == (
      "x = f__null3(1)  # f stays in comments\nassert g.f == 'f' and h(f=2) == f__null3\n"
      "é = f__null3(é)\n")


def test_values_give_constants_and_structures_of_zeros_and_ones():
  value = (np.arange(6, dtype=np.float32).reshape(2, 3), [1, 2], {"a": 3.5})
  bodies = nulls.value_bodies([value, "text"], source=scicode.target_source)
  space = {}
  for name in ("return target 0", "return zeros like target 0", "return ones like target 0"):
    exec(nulls.define("g", bodies[name]), space)  # pylint: disable=exec-used
    got = space["g"]()
    assert got[0].shape == (2, 3) and got[0].dtype == np.float32 and len(got[1]) == 2
    assert list(got[2]) == ["a"]
  assert space["g"]()[1] == [1, 1] and space["g"]()[0].sum() == 6
  assert "return zeros like target 1" not in bodies  # a string has no zeros
  assert bodies["return target 1"] == "return 'text'"


def test_a_generic_null_by_name():
  assert nulls.function("f", "return []") == "def f(*args, **kwargs):\n    return []\n"
  with pytest.raises(ValueError, match="null='nothing'"):
    nulls.function("f", "nothing")


def test_a_baseline_is_measured_once_and_kept_on_disk(tmp_path, monkeypatch):
  monkeypatch.setattr(nulls, "CACHE_DIR", str(tmp_path))
  calls = []

  def compute():
    calls.append(1)
    return 3
  key = nulls.key("a node no other test measures", tmp_path.name)
  assert nulls.cached(key, compute) == 3 and nulls.cached(key, compute) == 3 and len(calls) == 1
  nulls._MEMO.clear()  # pylint: disable=protected-access  # a new process reads the file
  assert nulls.cached(key, lambda: 99) == 3
  nulls._MEMO.clear()  # pylint: disable=protected-access
  (tmp_path / f"{key}.json").write_text('{"baseline": "3"}')  # damaged: measured again
  assert nulls.cached(key, lambda: 4) == 4
  assert '"baseline": 4' in (tmp_path / f"{key}.json").read_text()
