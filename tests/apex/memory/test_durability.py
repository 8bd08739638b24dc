"""Schema migration, corrupt files, a writer killed mid-batch, readers beside a writer."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from apex_jax.memory import SCHEMA_VERSION, MemoryBank, MemoryBankError, NewMemory
from apex_jax.memory.schema import migrate, user_version
from tests.apex.memory.fakes import HashEmbedder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def test_migration_from_version_1(tmp_path):
  path = str(tmp_path / "old.db")
  conn = sqlite3.connect(path, isolation_level=None)
  assert migrate(conn, path, upto=1) == 1
  vec = np.arange(32, dtype=np.float32).tobytes()
  conn.execute("INSERT INTO memories (category, modality, question, workflow_summary, outcome, "
               "success_count, usage_count, q_emb) VALUES ('time', 'text-only', 'old q', 's', "
               "'correct', 2, 3, ?)", (vec,))
  doc = {"skill_name": "t", "category": "time", "modality": "text-only", "description": "d",
         "procedure": [{"step": 1, "action": "a", "purpose": "p"}], "pitfalls": [],
         "version": 4, "correct_count": 1, "evidence_count": 2, "operation": "refine"}
  conn.execute("INSERT INTO skills VALUES ('time', 'text-only', ?)", (json.dumps(doc),))
  conn.execute("INSERT INTO meta VALUES ('dim', '32')")
  conn.close()

  bank = MemoryBank(path, HashEmbedder())
  assert user_version(bank._conn) == SCHEMA_VERSION == 2
  old = bank.memories("time/text-only")[0]
  assert (old.question, old.win_rate, old.data_id) == ("old q", pytest.approx(2 / 3), None)
  assert [s.version for s in bank.skill_history("time/text-only")] == [4]
  assert bank.get_skill("time/text-only").evidence_count == 2
  assert bank.add("new q", "s", True, category="time", data_id="d1").id == old.id + 1
  assert bank.retrieve("new q", category="time").correct[0].memory.data_id == "d1"


def test_newer_schema_is_refused(tmp_path):
  path = str(tmp_path / "new.db")
  MemoryBank(path, HashEmbedder()).close()
  conn = sqlite3.connect(path)
  conn.execute("PRAGMA user_version = 99")
  conn.close()
  with pytest.raises(MemoryBankError, match=r"new.db: schema version 99 is newer than this "
                                            r"code's 2"):
    MemoryBank(path, HashEmbedder())


@pytest.mark.parametrize("version", [-5, -1, -(2**31)])
def test_a_schema_version_no_code_wrote_is_refused(tmp_path, version):
  """A negative user_version indexed MIGRATIONS from the end: -5 raised IndexError, -1 ran the
  v2 migration again on a v2 bank."""
  path = str(tmp_path / "odd.db")
  MemoryBank(path, HashEmbedder()).close()
  conn = sqlite3.connect(path)
  conn.execute(f"PRAGMA user_version = {version}")
  conn.close()
  with pytest.raises(MemoryBankError, match=rf"odd.db: schema version \(PRAGMA user_version\) "
                                            rf"is {version}, .*known versions 0 to 2"):
    MemoryBank(path, HashEmbedder())
  conn = sqlite3.connect(path)  # refused, not touched
  assert user_version(conn) == version
  conn.close()


@pytest.mark.parametrize("content", [b"garbage bytes, not sqlite " * 200,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_corrupt_file_gives_clear_error(tmp_path, content):
  path = tmp_path / "broken.db"
  path.write_bytes(content)
  with pytest.raises(MemoryBankError, match=r"broken.db: not a usable memory database"):
    MemoryBank(str(path), HashEmbedder())


def test_other_sqlite_database_is_left_alone(tmp_path):
  path = str(tmp_path / "other.db")
  conn = sqlite3.connect(path)
  conn.execute("CREATE TABLE invoices (id INTEGER)")
  conn.commit()
  conn.close()
  with pytest.raises(MemoryBankError, match="other.db: not a memory database .*invoices"):
    MemoryBank(path, HashEmbedder())
  conn = sqlite3.connect(path)
  assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["invoices"]


CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from apex_jax.memory import MemoryBank, NewMemory
from tests.apex.memory.fakes import HashEmbedder
bank = MemoryBank({path!r}, HashEmbedder())
def hook(new_id, seen=[]):
  seen.append(new_id)
  if len(seen) == 4:  # four rows of the batch written, not committed
    open({marker!r}, "w").close()
    time.sleep(60)
bank.after_insert = hook
bank.add_many([NewMemory(f"batch question {{i}} b{{i}}", "s", True, "time") for i in range(8)])
"""


def test_writer_killed_mid_batch_leaves_no_partial_batch(tmp_path):
  path, marker = str(tmp_path / "m.db"), str(tmp_path / "inside")
  bank = MemoryBank(path, HashEmbedder())
  bank.add_many([NewMemory(f"earlier question {i} e{i}", "s", False, "time") for i in range(3)])
  child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=ROOT, path=path,
                                                               marker=marker)])
  try:
    deadline = time.time() + 60
    while not os.path.exists(marker):
      assert child.poll() is None, "the writer exited before reaching the batch"
      assert time.time() < deadline, "the writer never reached the batch"
      time.sleep(0.05)
    assert len(bank) == 3  # a reader beside the open transaction sees the old state
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
  finally:
    if child.poll() is None:
      child.kill()
  after = MemoryBank(path, HashEmbedder())
  assert after._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
  assert len(after) == 3 and len(bank) == 3
  assert all(m.question.startswith("earlier") for m in after.memories("time/text-only"))
  assert after.add("a later question", "s", True, category="time").action == "added"
  assert len(bank) == 4


def test_failed_batch_rolls_back_file_and_cache(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder())
  first = bank.add("an older question", "s", False, category="time").id
  bank.retrieve("an older question", category="time")  # the bucket is cached now

  def hook(new_id):
    if new_id == first + 3:
      raise RuntimeError("disk full")
  bank.after_insert = hook
  with pytest.raises(RuntimeError, match="disk full"):
    bank.add_many([NewMemory(f"new question {i} n{i}", "s", True, "time") for i in range(5)])
  assert len(bank) == 1
  got = bank.retrieve("new question 1 n1", category="time", k=5)
  assert got.memory_ids == (first,)  # no memory of the failed batch, in the file or the cache
  bank.after_insert = None
  assert bank.add("new question 1 n1", "s", True, category="time").id == first + 1


def test_readers_never_see_part_of_a_batch(tmp_path):
  path = str(tmp_path / "m.db")
  MemoryBank(path, HashEmbedder()).add("seed question", "s", True, category="event")
  batches, size = 15, 4
  errors, seen = [], []
  done, started = threading.Event(), threading.Barrier(4, timeout=60)

  def write():
    bank = MemoryBank(path, HashEmbedder())
    try:
      started.wait()
      for b in range(batches):
        bank.add_many([NewMemory(f"event {b} {i}", "s", i % 2 == 0, "event")
                       for i in range(size)], dedup=False)
        time.sleep(0.02)  # let the readers look between batches
    except Exception as err:  # reported by the main thread
      errors.append(err)
    finally:
      done.set()

  def read():
    bank = MemoryBank(path, HashEmbedder())
    try:
      started.wait()
      while not done.is_set():
        n = bank.count("event/text-only")
        seen.append(n)
        if (n - 1) % size:
          errors.append(AssertionError(f"reader saw {n} memories: part of a batch"))
        got = bank.retrieve("event 3 1", category="event", k=2)
        assert len(got.correct) <= 2 and len(got.incorrect) <= 2
        time.sleep(0.002)
    except Exception as err:
      errors.append(err)

  threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not errors, errors[:3]
  assert MemoryBank(path, HashEmbedder()).count("event/text-only") == 1 + batches * size
  assert len(set(seen)) > 1  # the readers ran while the writer wrote


def test_one_bank_shared_by_threads(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder())
  errors = []

  def work(t):
    try:
      for i in range(10):
        mem_id = bank.add_many([NewMemory(f"thread {t} item {i}", "s", True, "human")],
                               dedup=False)[0].id
        bank.record_outcome([mem_id], i % 2 == 0)
        bank.retrieve(f"thread {t} item {i}", category="human")
    except Exception as err:
      errors.append(err)

  threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not errors, errors[:3]
  assert bank.count("human/text-only") == 40
  assert sum(m.usage_count for m in bank.memories("human/text-only")) == 80
