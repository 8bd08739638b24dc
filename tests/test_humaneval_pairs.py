"""benchmarks.humaneval_pairs on records written here, its counts and p-values by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks import humaneval_pairs


def _write(path, passed: dict[int, bool]):
  with open(path, "w") as f:
    for i, ok in passed.items():
      pid = f"HumanEval/{i}"
      f.write(json.dumps({"kind": "node", "problem_id": pid, "node_id": "1",
                          "passed": ok}) + "\n")
      f.write(json.dumps({"kind": "problem", "problem_id": pid, "passed": ok}) + "\n")


@pytest.fixture
def records(tmp_path):
  # The reference in two chunks of 12 problems (0-11 and 12-23), the baseline on the first 10.
  base = tmp_path / "base"
  base.mkdir()
  _write(base / "chunk_0.jsonl", {i: i % 2 == 0 for i in range(12)})
  _write(base / "chunk_12.jsonl", {i: True for i in range(12, 24)})
  # Against base on 0-9 (base passes 0, 2, 4, 6, 8): the baseline passes every one of 0-9
  # but 2, so it alone passes 1, 3, 5, 7, 9 and base alone passes 2.
  other = tmp_path / "other.jsonl"
  _write(other, {i: i != 2 for i in range(10)})
  return str(base), str(other)


def test_table_by_hand(records):
  base, other = records
  systems = {"base": humaneval_pairs.problem_passes(base),
             "other": humaneval_pairs.problem_passes(other)}
  assert len(systems["base"]) == 24
  result = humaneval_pairs.table(systems, ["base"])
  assert result["problems"] == [f"HumanEval/{i}" for i in range(10)]  # numeric order, not text
  assert result["passed"] == {"base": 5, "other": 9}
  pair = result["pairs"]["other - base"]
  assert pair["a_only"] == [f"HumanEval/{i}" for i in (1, 3, 5, 7, 9)]
  assert pair["b_only"] == ["HumanEval/2"]
  # 5 against 1: 2 * (C(6,0) + C(6,1)) / 64 = 14 / 64.
  assert pair["p_value"] == pytest.approx(14 / 64)


def test_a_system_missing_a_problem_is_refused(records, tmp_path):
  base, _ = records
  gap = tmp_path / "gap.jsonl"
  _write(gap, {i: True for i in range(20)})
  short = tmp_path / "short.jsonl"
  _write(short, {i: True for i in (0, 1, 30)})
  systems = {name: humaneval_pairs.problem_passes(str(p))
             for name, p in (("base", base), ("gap", gap), ("short", short))}
  with pytest.raises(ValueError, match=r"has no record of \['HumanEval/30'\]"):
    humaneval_pairs.table(systems, ["base"])


def test_bad_arguments_are_named(records, tmp_path):
  base, other = records
  with pytest.raises(ValueError, match="name=path"):
    humaneval_pairs.parse_records(["base"])
  (tmp_path / "empty").mkdir()
  for path in (tmp_path / "empty", tmp_path / "missing.jsonl"):
    with pytest.raises(ValueError, match="no JSONL records"):
      humaneval_pairs.problem_passes(str(path))
  systems = {"other": humaneval_pairs.problem_passes(other)}
  with pytest.raises(ValueError, match="--against"):
    humaneval_pairs.table(systems, ["base"])
