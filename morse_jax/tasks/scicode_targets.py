"""SciCode test targets read from the official test_data.h5.

The official harness (scicode-bench/SciCode, src/scicode/parse/parse.py: `process_hdf5_to_tuple`
and the `save_data_to_hdf5` writer beside it) binds `target = targets[i]` before test case i of a
step, with `targets` read from this layout:

  /<step_id>/test<i>/var<k>    step_id "13.6" (problem 13, step 6); i = 1..number of tests

A test with one variable gives that value, one with several a tuple of them in var order. Each
variable is either
  - a dataset: its value, `ds[()]` (a numpy array or numpy scalar), with bytes decoded as UTF-8;
  - a group, decided by its first member (in HDF5's name order):
      "list" (a group): a list of that group's members var1, var2, ...;
      "sparse_matrix" (a group): a scipy sparse matrix: data + shape with row + col (coo), else
        indices + indptr + blocksize (bsr), else indices + indptr (csr);
      anything else: a dict of its members. A member that is a dataset and not a string gets
        float(key) as its key when the key parses as a float ("1" -> 1.0); string and group
        members keep the str key;
  - an empty group: None (the official reader falls through and returns None).
The writer stores None and other unknown objects as str(value), so those come back as strings.

Where we differ from the official reader, it is on inputs it cannot handle or would garble:
  - members are taken in natural order (var2 before var10); HDF5's name order, which the official
    reader uses, puts var10 before var2 and scrambles lists and tuples of 10 or more values
    (the writer numbers them in order);
  - list items and dict members that are groups are read recursively (the official reader
    fails on them), and bytes list items are decoded too (it leaves those as bytes);
  - an empty dataset (h5py.Empty) is read as None.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import h5py


class TargetsError(ValueError):
  """test_data.h5 cannot be read, or holds something outside the official layout."""


class TargetsNotFoundError(TargetsError, KeyError):
  """The file has no group for the step or for one of its tests."""

  def __str__(self) -> str:  # KeyError would quote the message
    return str(self.args[0]) if self.args else ""


def _natural(key: str) -> list[Any]:
  return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _ordered(group: h5py.Group) -> list[str]:
  return sorted(group.keys(), key=_natural)


def _dataset(ds: h5py.Dataset) -> Any:
  value = ds[()]
  if isinstance(value, h5py.Empty):
    return None
  if isinstance(value, bytes):  # also np.bytes_
    try:
      return value.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
      raise TargetsError(f"{ds.name}: string is not UTF-8: {e}") from e
  return value


def _sparse(group: h5py.Group) -> Any:
  import scipy.sparse  # pylint: disable=g-import-not-at-top  (only sparse targets need it)

  def get(name: str) -> Any:
    if name not in group or not isinstance(group[name], h5py.Dataset):
      raise TargetsError(f"{group.name}: sparse matrix has no dataset {name!r} (has "
                         f"{sorted(group.keys())})")
    return group[name][()]

  data, shape = get("data"), tuple(int(n) for n in get("shape"))
  if "row" in group and "col" in group:
    return scipy.sparse.coo_matrix((data, (get("row"), get("col"))), shape=shape)
  if "blocksize" in group:
    blocksize = tuple(int(n) for n in get("blocksize"))
    return scipy.sparse.bsr_matrix((data, get("indices"), get("indptr")), shape=shape,
                                   blocksize=blocksize)
  # The writer stores csc like csr (no format marker), so the official reader, and we, read csr.
  return scipy.sparse.csr_matrix((data, get("indices"), get("indptr")), shape=shape)


def _dict(group: h5py.Group) -> dict[Any, Any]:
  out: dict[Any, Any] = {}
  for key, obj in group.items():  # name order, as the official reader builds it
    if isinstance(obj, h5py.Group):
      inner = obj.get("sparse_matrix")
      out[key] = _sparse(inner) if isinstance(inner, h5py.Group) else _group(obj)
      continue
    value = _dataset(obj)
    if isinstance(value, str):
      out[key] = value
      continue
    try:
      out[float(key)] = value
    except ValueError:
      out[key] = value
  return out


def _group(group: h5py.Group) -> Any:
  keys = list(group.keys())
  if not keys:
    return None
  member = group[keys[0]]
  if keys[0] == "list" and isinstance(member, h5py.Group):
    return [_read(member[k]) for k in _ordered(member)]
  if keys[0] == "sparse_matrix" and isinstance(member, h5py.Group):
    return _sparse(member)
  return _dict(group)


def _read(obj: h5py.Group | h5py.Dataset) -> Any:
  if isinstance(obj, h5py.Dataset):
    return _dataset(obj)
  if isinstance(obj, h5py.Group):
    return _group(obj)
  raise TargetsError(f"{obj.name}: neither a dataset nor a group")


def _read_step(f: h5py.File, where: str, step_id: str, num_tests: int) -> list[Any]:
  step = f.get(step_id)
  if step is None:
    raise TargetsNotFoundError(f"{where}: no step {step_id!r} (no group /{step_id})")
  if not isinstance(step, h5py.Group):
    raise TargetsError(f"{where}: step {step_id}: /{step_id} is not a group")
  values = []
  for i in range(1, num_tests + 1):
    at = f"{where}: step {step_id} test {i}"
    test = step.get(f"test{i}")
    if test is None:
      raise TargetsNotFoundError(f"{at}: no group /{step_id}/test{i} (the step has "
                                 f"{sorted(step.keys(), key=_natural)})")
    if not isinstance(test, h5py.Group):
      raise TargetsError(f"{at}: /{step_id}/test{i} is not a group")
    keys = _ordered(test)
    if not keys:
      raise TargetsError(f"{at}: /{step_id}/test{i} holds no variables")
    try:
      parts = [_read(test[k]) for k in keys]
    except TargetsError as e:
      raise TargetsError(f"{at}: {e}") from e
    except (KeyError, ValueError, TypeError, OSError) as e:  # h5py / scipy on malformed data
      raise TargetsError(f"{at}: cannot read: {type(e).__name__}: {e}") from e
    values.append(parts[0] if len(parts) == 1 else tuple(parts))
  return values


def _open(path: str) -> h5py.File:
  try:
    return h5py.File(path, "r")
  except (OSError, ValueError) as e:
    raise TargetsError(f"{path}: cannot open as HDF5: {e}") from e


def load_targets(h5_path: str | os.PathLike[str], step_id: str, num_tests: int) -> list[Any]:
  """The targets of tests 1..num_tests of `step_id` ("13.6"), one value per test.

  Raises:
    TargetsNotFoundError: the step or a test is not in the file (a KeyError too).
    TargetsError: the file cannot be opened, or a value is outside the official layout.
  """
  path = os.fspath(h5_path)
  if isinstance(num_tests, bool) or not isinstance(num_tests, int) or num_tests < 0:
    raise ValueError(f"load_targets: num_tests={num_tests!r}; expected an int >= 0")
  with _open(path) as f:
    return _read_step(f, path, str(step_id), num_tests)


class TargetFile:
  """One test_data.h5. The file is opened only when a step is first asked for (and closed after
  each read, so nothing stays open across forks or threads); each step is read once."""

  def __init__(self, path: str | os.PathLike[str]):
    self.path = os.fspath(path)
    self._steps: dict[str, list[Any]] = {}
    self._lock = threading.Lock()

  def __repr__(self) -> str:
    return f"TargetFile({self.path!r})"

  def __getstate__(self) -> dict[str, Any]:  # a lock cannot be pickled or deep-copied
    return {"path": self.path, "steps": dict(self._steps)}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.path, self._steps, self._lock = state["path"], state["steps"], threading.Lock()

  def targets(self, step_id: str, num_tests: int) -> list[Any]:
    """As `load_targets`, from the cache when the step was read before with as many tests."""
    step_id = str(step_id)
    with self._lock:
      cached = self._steps.get(step_id)
      if cached is None or len(cached) < num_tests:
        cached = self._steps[step_id] = load_targets(self.path, step_id, num_tests)
      return cached[:num_tests]

  def __contains__(self, step_id: object) -> bool:
    with self._lock:
      if str(step_id) in self._steps:
        return True
      with _open(self.path) as f:
        return isinstance(f.get(str(step_id)), h5py.Group)
