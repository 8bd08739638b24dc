"""benchmarks/apex_ttrl_memories: the memories TTRL added (ids not in the bank before TTRL), their
judged outcome, and their last answer against gold, on a hand-built pair of banks."""

import os
import sqlite3

import pytest

from benchmarks.apex_ttrl_memories import ttrl_memories


def _bank(path, rows):
  with sqlite3.connect(path) as conn:
    conn.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, outcome TEXT, question TEXT, "
                 "workflow_summary TEXT)")
    conn.executemany("INSERT INTO memories VALUES (?, ?, ?, ?)", rows)


def test_counts_added_memories_judged_and_right_by_gold(tmp_path):
  built = [(1, "correct", "q1", "1. answer 'x'")]
  ttrl = [(2, "correct", "q2", "1. search(\" a\") 2. answer ' wrong' 3. answer ' Paris'"),
          (3, "correct", "q3", "1. answer ' 12'"),
          (4, "incorrect", "q2", "1. search(\" a\")")]  # no answer: not right
  os.makedirs(tmp_path / "banks")
  _bank(str(tmp_path / "banks" / "before_ttrl.db"), built)
  _bank(str(tmp_path / "memory.db"), built + ttrl)
  gold = {"q1": ["x"], "q2": ["paris"], "q3": ["13"]}
  assert ttrl_memories(str(tmp_path), gold) == dict(added=3, judged_correct=2, right=1)


def test_a_missing_bank_is_named_with_what_keeps_it(tmp_path):
  _bank(str(tmp_path / "memory.db"), [(1, "correct", "q1", "1. answer 'x'")])
  with pytest.raises(FileNotFoundError, match=r"before_ttrl\.db: no such bank.*without_ttrl"):
    ttrl_memories(str(tmp_path), {})
  with pytest.raises(FileNotFoundError, match=r"nowhere.*memory\.db: no such bank"):
    ttrl_memories(str(tmp_path / "nowhere"), {})
