"""The harness's strict comparisons (morse_jax/execution/strict.py): an answer equals a target only
with the target's shape, length, keys and kind of values; NaN only where the target is NaN.
Everything runs in one harness, as the task families run their tests."""

from __future__ import annotations

import re

import pytest

from morse_jax.execution import verifier
from morse_jax.tasks import scicode_gold

PROGRAM = """
import numpy as np
def empty(*a): return np.empty((0, 1, 1, 1))
def empty_list(*a): return []
def zeros3(*a): return np.zeros(3)
def scalar0(*a): return 0.0
def two_empties(*a): return (np.empty((0, 1)), np.empty((0, 1)))
def nan3(*a): return np.array([np.nan, 1.0, 2.0])
def ints(*a): return np.array([1, 2, 3])
def bools(*a): return np.array([True, False])
def pair(*a): return (np.arange(3.0), 2.0)
def nested(*a): return {"a": [np.empty((0, 1))]}
"""

CMP = "from scicode.compare.cmp import cmp_tuple_or_list, are_dicts_close\n"
# (test, whether it passes)
CASES = [
    ("assert np.allclose(empty(), strict_target(np.arange(3.0)))", False),
    ("assert (empty() == strict_target(np.arange(3.0))).all()", False),
    ("assert np.allclose(empty(), np.arange(3.0))", False),  # the answer side alone is strict
    ("assert (empty() == np.arange(3.0)).all()", False),
    ("assert np.all(np.abs(empty() - np.arange(3.0)) < 1e-6)", False),
    ("assert np.allclose(empty_list(), 5.0)", False),
    ("assert np.allclose(empty(), 5.0)", False),
    ("assert np.array_equiv(empty(), np.ones(3))", False),
    ("assert (scalar0() == strict_target(np.zeros(3))).all()", False),
    ("assert np.allclose(scalar0(), strict_target(np.zeros(3)))", False),
    ("assert all(np.allclose(a, b) for a, b in zip(two_empties(), (np.ones(1),) * 3))", False),
    ("assert all(np.allclose(a, b) for a, b in zip(empty_list(), strict_target([1.0, 2.0])))",
     False),
    ("np.testing.assert_allclose(empty(), np.ones(3))", False),
    ("assert np.allclose(nan3(), np.array([1.0, 1.0, 2.0]))", False),
    ("assert np.allclose(bools(), np.array([1.0, 0.0]))", False),
    (CMP + "assert cmp_tuple_or_list(two_empties(), strict_target((np.ones(2), np.ones(2))))",
     False),
    (CMP + "assert cmp_tuple_or_list(two_empties(), strict_target([1.0, 2.0]))", False),
    (CMP + "assert are_dicts_close(nested(), {'a': [np.ones(2)]})", False),
    ("assert (empty() == 5.0).all()", False),  # an empty answer against a scalar
    ("assert np.isclose(empty(), 0).all()", False),
    ("assert not np.isnan(empty()).any()", False),  # vacuous over an empty answer
    ("assert (empty() > 0).all()", False),
    ("assert (np.empty((0, 1, 1, 1)) == strict_target(np.empty((0, 1, 1, 1)))).all()", True),
    ("assert (empty() == strict_target(np.empty((0, 1, 1, 1)))).all()", True),  # empty is right
    # Right answers still pass.
    ("assert np.allclose(zeros3(), 0) and np.isclose(zeros3(), 0.0).all()", True),
    ("assert np.allclose(zeros3(), strict_target(np.zeros(3)))", True),
    ("assert (ints() == [1, 2, 3]).all() and ints().sum() == 6", True),
    ("assert np.allclose(ints(), np.array([1.0, 2.0, 3.0]))", True),  # int and float: numbers
    ("assert np.allclose(ints() - ints().mean(), [-1, 0, 1])", True),
    ("assert np.allclose(nan3(), strict_target(np.array([np.nan, 1.0, 2.0])))", True),
    ("for a, b in zip(pair(), strict_target((np.arange(3.0), 2.0))):\n"
     "  assert np.allclose(a, b)", True),
    (CMP + "assert cmp_tuple_or_list(pair(), strict_target([np.arange(3.0), 2.0]))", True),
    ("assert list(zip([1, 2], 'ab', strict=False)) == [(1, 'a'), (2, 'b')]", True),
]


@pytest.fixture(scope="module")
def run():
  tests = [t for t, _ in CASES]
  return verifier.run_tests(PROGRAM, tests, prelude="import numpy as np", timeout_s=30.0,
                            files=scicode_gold.support_files([CMP]))


def test_structure_mismatches_fail_and_right_answers_pass(run):
  failed = {int(re.match(r"test (\d+)", e).group(1)) for e in run.errors}
  expected = {i for i, (_, ok) in enumerate(CASES) if not ok}
  assert failed == expected, [(i, CASES[i][0][:70]) for i in failed ^ expected]
  assert run.passed == len(CASES) - len(expected)


def test_refusals_say_why(run):
  text = " ".join(run.errors)
  assert "StrictComparisonError" in text and "shape" in text
  assert "ValueError: zip()" in text  # the strict zip of the tests' builtins
