"""SciCode targets from an HDF5 file in the official test_data.h5 layout, and scoring with them."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import h5py
import numpy as np
import pytest
import scipy.sparse

from morse_jax.tasks import scicode
from morse_jax.tasks import scicode_targets as st

ARRAY = np.array([[1.5, np.nan, -np.inf], [0.0, 2.0, np.inf]])
COMPLEX = np.array([1 + 2j, -0.5j, np.nan + 1j])
COO = scipy.sparse.coo_matrix(([1.0, 2.0, 3.0], ([0, 1, 2], [2, 0, 1])), shape=(3, 4))
CSR = scipy.sparse.csr_matrix(np.array([[0, 5, 0], [7, 0, 8]], dtype=np.int64))
BSR = scipy.sparse.bsr_matrix(np.where(np.arange(16) % 3 == 0, np.arange(16.0), 0).reshape(4, 4),
                              blocksize=(2, 2))


def _sparse(parent: h5py.Group, name: str, m) -> None:
  # As the official writer: <name>/sparse_matrix/{data, shape, row+col | indices+indptr[+blocksize]}
  g = parent.create_group(name).create_group("sparse_matrix")
  g["data"], g["shape"] = m.data, m.shape
  if m.format == "coo":
    g["row"], g["col"] = m.row, m.col
  else:
    g["indices"], g["indptr"] = m.indices, m.indptr
    if m.format == "bsr":
      g["blocksize"] = m.blocksize


def _write(path) -> None:
  with h5py.File(path, "w") as f:
    s = f.create_group("7.1")  # one variable per test
    s["test1/var1"] = ARRAY
    s["test2/var1"] = COMPLEX
    s["test3/var1"] = np.float64(0.25)
    s["test4/var1"] = "héllo"  # a variable-length UTF-8 string: read back as bytes by h5py
    s["test5/var1"] = True
    s.create_group("test6/var1")  # empty group: None
    s = f.create_group("7.2")  # several variables per test: a tuple
    s["test1/var1"], s["test1/var2"], s["test1/var3"] = np.arange(3), 4, "ok"
    items = s.create_group("test2/var1/list")  # 11 items: var10 must come after var9
    for k in range(1, 12):
      items[f"var{k}"] = k * 10
    s["test2/var2"] = 1.0
    items = s.create_group("test3/var1/list")
    items["var1"], items["var2"] = "a", np.array([1.0, 2.0])
    items.create_group("var3/list")["var1"] = 5  # nested list (the official reader fails here)
    d = s.create_group("test4/var1")  # dict
    d["alpha"], d["1"], d["2"], d["name"] = 0.5, np.array([1, 2]), "two", "x"
    _sparse(d, "m", CSR)
    d.create_group("inner")["k"] = 3
    s = f.create_group("7.3")  # sparse matrices
    _sparse(s.create_group("test1"), "var1", COO)
    _sparse(s.create_group("test2"), "var1", CSR)
    _sparse(s.create_group("test3"), "var1", BSR)
    bad = s.create_group("test4/var1/sparse_matrix")  # no indices / indptr
    bad["data"], bad["shape"] = [1.0], (1, 1)


@pytest.fixture(scope="module")
def h5(tmp_path_factory):
  path = tmp_path_factory.mktemp("h5") / "test_data.h5"
  _write(path)
  return str(path)


def test_datasets_strings_and_none(h5):
  values = st.load_targets(h5, "7.1", 6)
  np.testing.assert_array_equal(values[0], ARRAY)
  np.testing.assert_array_equal(values[1], COMPLEX)
  assert values[2] == 0.25 and isinstance(values[2], np.float64)
  assert values[3] == "héllo" and isinstance(values[3], str)
  assert values[4] == True and isinstance(values[4], np.bool_)  # noqa: E712
  assert values[5] is None
  assert st.load_targets(h5, "7.1", 2)[1].dtype == np.complex128
  assert st.load_targets(h5, "7.1", 0) == []


def test_tuples_lists_and_dicts(h5):
  t1, t2, t3, t4 = st.load_targets(h5, "7.2", 4)
  assert isinstance(t1, tuple) and len(t1) == 3
  np.testing.assert_array_equal(t1[0], [0, 1, 2])
  assert t1[1:] == (4, "ok")
  assert t2[0] == [10 * k for k in range(1, 12)] and t2[1] == 1.0  # natural var order
  assert t3[0] == "a" and list(t3[1]) == [1.0, 2.0] and t3[2] == [5]
  assert set(t4) == {"alpha", 1.0, "2", "name", "m", "inner"}
  assert t4["alpha"] == 0.5 and list(t4[1]) == [1, 2] and t4[1.0] is t4[1]  # "1" -> 1.0
  assert t4["2"] == "two" and t4["name"] == "x"  # str values keep their str key
  assert t4["m"].format == "csr" and (t4["m"] != CSR).nnz == 0
  assert t4["inner"] == {"k": 3}


def test_sparse(h5):
  coo, csr, bsr = st.load_targets(h5, "7.3", 3)
  for got, want in ((coo, COO), (csr, CSR), (bsr, BSR)):
    assert got.format == want.format and got.shape == want.shape
    np.testing.assert_array_equal(got.toarray(), want.toarray())
  assert bsr.blocksize == (2, 2)


def test_errors_name_file_step_and_test(h5, tmp_path):
  with pytest.raises(st.TargetsNotFoundError, match=r"test_data\.h5: no step '9\.9'") as e:
    st.load_targets(h5, "9.9", 1)
  assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
  assert str(e.value).startswith(h5)  # not quoted as KeyError messages are
  with pytest.raises(KeyError, match=r"step 7\.1 test 7: no group /7\.1/test7"):
    st.load_targets(h5, "7.1", 7)
  with pytest.raises(st.TargetsError, match=r"step 7\.3 test 4: .*no dataset 'indices'"):
    st.load_targets(h5, "7.3", 4)
  not_h5 = tmp_path / "plain.txt"
  not_h5.write_text("hello")
  with pytest.raises(st.TargetsError, match=r"plain\.txt: cannot open as HDF5"):
    st.load_targets(str(not_h5), "7.1", 1)
  with pytest.raises(ValueError, match="num_tests"):
    st.load_targets(h5, "7.1", -1)


def test_target_file_is_lazy_and_caches(h5, tmp_path):
  missing = st.TargetFile(tmp_path / "absent.h5")  # nothing is opened yet
  with pytest.raises(st.TargetsError, match="absent.h5"):
    missing.targets("7.1", 1)
  copy = tmp_path / "copy.h5"
  copy.write_bytes(open(h5, "rb").read())
  file = st.TargetFile(copy)
  first = file.targets("7.2", 2)
  assert "7.2" in file and "7.1" in file and "8.1" not in file
  os.remove(copy)  # later reads of the same step come from the cache
  assert file.targets("7.2", 1)[0] is first[0] and file.targets("7.2", 2)[1] is first[1]


def test_target_source_rebuilds_every_kind(h5):
  values = (st.load_targets(h5, "7.1", 6) + st.load_targets(h5, "7.2", 4)
            + st.load_targets(h5, "7.3", 3))
  for value in values:
    again = eval(scicode.target_source(value))  # noqa: S307  (our own source)
    _assert_same(again, value)
  big = np.random.default_rng(0).normal(size=(40, 30)).astype(np.float32)
  big[3, 4] = np.nan
  source = scicode.target_source(big)
  assert "b64decode" in source and len(source) < 2 * big.nbytes
  _assert_same(eval(source), big)  # noqa: S307
  ragged = np.empty(2, dtype=object)
  ragged[0], ragged[1] = np.arange(2), np.arange(2)
  _assert_same(eval(scicode.target_source(ragged)), ragged)  # noqa: S307
  _assert_same(eval(scicode.target_source(np.zeros((0, 3)))), np.zeros((0, 3)))  # noqa: S307
  lil = scipy.sparse.lil_matrix(CSR)
  _assert_same(eval(scicode.target_source(lil)), lil)  # noqa: S307


def _assert_same(got, want):
  assert type(got) is type(want), (type(got), type(want))
  if scipy.sparse.issparse(want):
    assert got.format == want.format and got.shape == want.shape
    np.testing.assert_array_equal(got.toarray(), want.toarray())
  elif isinstance(want, np.ndarray):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.hasobject:
      for a, b in zip(got.ravel(), want.ravel()):
        _assert_same(a, b)
    else:
      np.testing.assert_array_equal(got, want)
  elif isinstance(want, (list, tuple)):
    assert len(got) == len(want)
    for a, b in zip(got, want):
      _assert_same(a, b)
  elif isinstance(want, dict):
    assert list(got) == list(want)
    for k in want:
      _assert_same(got[k], want[k])
  elif isinstance(want, float) and math.isnan(want):
    assert math.isnan(got)
  else:
    assert got == want


def test_step_id():
  assert scicode.step_id("13", "13.6") == "13.6"
  assert scicode.step_id("13", "6") == "13.6"
  assert scicode.step_id("1", "13.6") == "1.13.6"


PROBLEM = {
    "problem_id": "7", "problem_name": "stats",
    "problem_description_main": "Summaries of arrays.", "problem_io": "",
    "required_dependencies": "import numpy as np\nimport scipy.sparse",
    "sub_steps": [
        {"step_number": "7.1", "step_description_prompt": "Clean an array.",
         "function_header": "def clean(x):\n    '''Drop non-finite values.'''",
         "test_cases": [
             "assert np.allclose(clean(np.array([[1.5, np.nan, -np.inf], [0.0, 2.0, np.inf]])),"
             " target[np.isfinite(target)])",
             "assert clean(np.array([1.0])).shape == (1,)"],  # needs no target
         "return_line": "    return y"},
        {"step_number": "7.3", "step_description_prompt": "Sparse identity-like matrix.",
         "function_header": "def pattern(n):\n    '''A sparse matrix.'''",
         "test_cases": ["assert np.allclose(pattern(3).toarray(), target.toarray())"],
         "return_line": "    return m"},
    ],
}
CLEAN = "```python\ndef clean(x):\n    return x[np.isfinite(x)]\n```"
WRONG_CLEAN = "```python\ndef clean(x):\n    return np.nan_to_num(x).ravel()\n```"
PATTERN = ("```python\ndef pattern(n):\n    return scipy.sparse.coo_matrix(([1.0, 2.0, 3.0], "
           "([0, 1, 2], [2, 0, 1])), shape=(3, 4))\n```")
WRONG_PATTERN = "```python\ndef pattern(n):\n    return scipy.sparse.eye(3, 4)\n```"


def test_scoring_with_targets_h5(h5, tmp_path):
  path = tmp_path / "problems.json"
  path.write_text(json.dumps([PROBLEM]))
  p = scicode.load(str(path))[0]
  step1, step3 = p.gold_graph
  family = scicode.SciCode(targets_h5=h5)
  good = family.score_node(p, step1, CLEAN, {})
  assert (good.passed, good.details["tests"]) == (True, 2), good.details
  bad = family.score_node(p, step1, WRONG_CLEAN, {})
  # One of two tests passed, no more than one constant (the target) can pass: reward 0.
  assert (bad.reward, bad.passed, bad.details["tests_passed"]) == (0.0, False, 1)
  assert family.score_node(p, step3, PATTERN, {}).passed
  assert not family.score_node(p, step3, WRONG_PATTERN, {}).passed
  # Explicit targets win for the steps they name; a step the file lacks is a MissingTargetsError.
  override = scicode.SciCode(targets={"7.1": [np.array([0.0]), None]}, targets_h5=h5)
  assert not override.score_node(p, step1, CLEAN, {}).passed
  missing = r"problem 8 step 7\.1: .*no step '8\.7\.1'"
  with pytest.raises(scicode.MissingTargetsError, match=missing):
    family.score_node(dataclasses.replace(p, id="8"), step1, CLEAN, {})
