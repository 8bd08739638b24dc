"""Tagged JSON for SciCode targets: every kind of value comes back with its type and its bits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.sparse

from morse_jax.tasks import scicode_values as sv

DENSE = np.array([[1, 0, 2], [0, 0, 3]], dtype=np.float32)
RECORD = np.dtype([("name", "U4"), ("mass", "<f8"), ("pos", "<i2", (2,))])


def _again(value):
  return sv.decode(json.loads(json.dumps(sv.encode(value), allow_nan=False)))


def _assert_same(got, want):
  assert type(got) is type(want), (type(got), type(want))
  if scipy.sparse.issparse(want):
    assert got.format == want.format and got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.toarray(), want.toarray())
  elif isinstance(want, np.ndarray):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.hasobject:
      for a, b in zip(got.ravel(), want.ravel()):
        _assert_same(a, b)
    else:
      assert got.tobytes() == want.tobytes()  # bits, so -0.0 and NaN payloads count
  elif isinstance(want, np.generic):
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
  elif isinstance(want, (list, tuple)):
    assert len(got) == len(want)
    for a, b in zip(got, want):
      _assert_same(a, b)
  elif isinstance(want, dict):
    assert list(got) == list(want)
    for k in want:
      _assert_same(got[k], want[k])
  elif isinstance(want, complex):
    _assert_same(got.real, want.real)
    _assert_same(got.imag, want.imag)
  elif isinstance(want, float):
    assert math.copysign(1, got) == math.copysign(1, want)
    assert (math.isnan(got) and math.isnan(want)) or got == want
  else:
    assert got == want


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2 ** 100, 0.1, -0.0, float("nan"), float("inf"), -float("inf"),
    complex(1.5, -0.0), complex(float("nan"), 2), "héllo", b"\x00\xff", [], (), (1,),
    [1, (2.5, "x"), [None]], {1, 2}, frozenset({"a"}),
    {"a": 1, 2.0: [3], (1, "b"): None, None: np.float64(0.5)},
])
def test_python_values(value):
  _assert_same(_again(value), value)


@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.int16).reshape(3, 4), np.array([1 + 2j, np.nan - 0.0j]),
    np.array([[-0.0, np.inf, np.nan]]), np.zeros((0, 3)), np.array(5.0), np.array([True, False]),
    np.array(["ab", "ü"]), np.array([("H", 1.0, (1, 2)), ("He", 4.0, (3, 4))], dtype=RECORD),
    np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(10)[::3],
    np.array([np.arange(2), "x", None], dtype=object),
    np.float64(-0.0), np.float32(1.25), np.int8(-3), np.uint64(2 ** 63), np.bool_(True),
    np.complex64(1 - 1j), np.str_("s"), np.array([("Li", 7.0, (5, 6))], dtype=RECORD)[0],
    np.dtype("<f4"),
])
def test_numpy_values(value):
  _assert_same(_again(value), value)


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "bsr", "lil", "dok", "dia"])
@pytest.mark.parametrize("kind", [scipy.sparse.coo_matrix, scipy.sparse.coo_array])
def test_sparse(fmt, kind):
  value = kind(DENSE).asformat(fmt)
  _assert_same(_again(value), value)
  assert _again(value).format == fmt


def test_bsr_keeps_its_blocks():
  value = scipy.sparse.bsr_matrix(np.kron(np.eye(2), np.ones((2, 2))), blocksize=(2, 2))
  assert _again(value).blocksize == (2, 2)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own warning
def test_unknown_types_are_named():
  class Thing:
    pass

  with pytest.raises(TypeError, match=r"type .*Thing"):
    sv.encode([1, Thing()])
  with pytest.raises(TypeError, match="matrix"):
    sv.encode(np.asmatrix([[1]]))  # a subclass, not an ndarray: refused rather than changed
  with pytest.raises(ValueError, match="not an encoded value"):
    sv.decode({"a": 1})
  with pytest.raises(ValueError, match="unknown tag 'pickle'"):
    sv.decode({"t": "pickle"})
