"""The memory bank's file failing: a lock held by another writer, a full disk,
damaged pages, bad embeddings. Every failure is a MemoryBankError naming the file and the cause;
nothing is a raw sqlite3 exception."""

import os
import random
import sqlite3
import time

import numpy as np
import pytest

from apex_jax.memory import MemoryBank, MemoryBankDatabaseError, MemoryBankError
from tests.apex.memory.fakes import HashEmbedder


def _bank(path, n=0, **kw):
  bank = MemoryBank(str(path), HashEmbedder(), **kw)
  if n:
    bank.add_many([dict(question=f"where is place number {i} xq{i}",
                        workflow_summary=f"1. search {i} " + "word " * 40, outcome=i % 2 == 0,
                        category="location") for i in range(n)])
  return bank


def test_lock_held_by_another_writer_is_reported_as_locked(tmp_path):
  path = tmp_path / "m.db"
  _bank(path, 3).close()
  other = sqlite3.connect(str(path), isolation_level=None)
  other.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
  other.execute("UPDATE memories SET usage_count = usage_count + 1")
  try:
    # Opening and reading take no write lock: they work while the other writer holds it.
    bank = _bank(path, timeout=0.3)
    assert len(bank) == 3
    assert bank.retrieve("where is place number 1", category="location").correct
    assert len(bank.memories("location/text-only")) == 3 and bank.get_skill(
        "location/text-only") is None
    start = time.perf_counter()
    with pytest.raises(MemoryBankDatabaseError) as err:
      bank.add("a new place", "s", True, category="location")
    waited = time.perf_counter() - start
    assert err.value.cause == "locked" and 0.25 < waited < 5
    assert str(path) in str(err.value) and "locked by another connection" in str(err.value)
    assert "waited 0.3 s for the lock" in str(err.value)
    assert "not a usable" not in str(err.value)
    bank.close()
  finally:
    other.execute("ROLLBACK")
    other.close()


def test_exclusive_lock_at_open_is_locked_not_unusable(tmp_path):
  path = tmp_path / "m.db"
  _bank(path, 2).close()
  other = sqlite3.connect(str(path), isolation_level=None)
  other.execute("PRAGMA journal_mode = DELETE")  # a writer that keeps readers out
  other.execute("BEGIN EXCLUSIVE")
  try:
    with pytest.raises(MemoryBankDatabaseError, match=r"m.db: locked by another connection "
                                                      r"while .*waited 0.2 s") as err:
      MemoryBank(str(path), HashEmbedder(), timeout=0.2)
    assert err.value.cause == "locked"
  finally:
    other.execute("ROLLBACK")
    other.close()
  assert len(_bank(path)) == 2  # the writer gone, the bank opens


def test_full_disk_is_named_and_the_batch_is_not_stored(tmp_path):
  path = tmp_path / "m.db"
  bank = _bank(path, 2)
  pages = bank._conn.execute("PRAGMA page_count").fetchone()[0]
  bank._conn.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: a full disk
  with pytest.raises(MemoryBankDatabaseError, match=r"m.db: the disk is full") as err:
    bank.add_many([dict(question=f"q{i} " + "long " * 200, workflow_summary="w " * 300,
                        outcome=True, category="time") for i in range(40)], dedup=False)
  assert err.value.cause == "disk_full" and isinstance(err.value, MemoryBankError)
  assert len(bank) == 2
  assert bank.retrieve("where is place number 1", category="location").correct  # still usable


def _damage_page(path, page: int, data: bytes):
  page_size = 4096
  with open(path, "r+b") as f:
    f.seek(page * page_size)
    f.write(data)


def test_damaged_page_is_named_at_open(tmp_path):
  path = tmp_path / "m.db"
  _bank(path, 80).close()
  assert os.path.getsize(path) > 6 * 4096
  _damage_page(path, 3, b"\x0d\xff\xff\xff" * 256)
  with pytest.raises(MemoryBankDatabaseError,
                     match=r"m.db: not a usable memory database: the file is damaged") as err:
    MemoryBank(str(path), HashEmbedder())
  assert err.value.cause == "corrupt"


def test_damaged_files_never_give_raw_sqlite_errors(tmp_path):
  """22 damaged copies of a bank (truncated, headers or pages overwritten, bytes flipped): each
  either opens and works (retrieval, add) or fails with a MemoryBankError naming the file."""
  good = tmp_path / "good.db"
  _bank(good, 80).close()
  content = good.read_bytes()
  rng = random.Random(0)
  variants = [content[:n] for n in (0, 50, 100, 4096, 4096 * 3 + 17, len(content) // 2)]
  variants.append(b"\0" * len(content))
  for page in (0, 1, 2, 4, 6):
    b = bytearray(content)
    b[page * 4096:page * 4096 + 512] = bytes(rng.randrange(256) for _ in range(512))
    variants.append(bytes(b))
  for _ in range(10):
    b = bytearray(content)
    for _ in range(8):
      b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    variants.append(bytes(b))
  assert len(variants) == 22
  outcomes = {"opened": 0, "refused": 0}
  for i, data in enumerate(variants):
    path = tmp_path / f"bad{i}.db"
    path.write_bytes(data)
    try:
      bank = MemoryBank(str(path), HashEmbedder(), timeout=0.2)
      bank.retrieve("where is place number 3", category="location")
      bank.add("a new memory", "s", True, category="time")
      bank.close()
      outcomes["opened"] += 1
    except MemoryBankError as e:
      assert str(path) in str(e), e
      outcomes["refused"] += 1
  assert outcomes["refused"] >= 10, outcomes


def test_schema_and_stored_dim_are_checked_at_open(tmp_path):
  path = tmp_path / "m.db"
  _bank(path, 2).close()
  conn = sqlite3.connect(str(path))
  conn.execute("UPDATE meta SET value = 'abc' WHERE key = 'dim'")
  conn.commit()
  conn.close()
  with pytest.raises(MemoryBankDatabaseError, match="stored embedding dim 'abc'"):
    MemoryBank(str(path), HashEmbedder())
  conn = sqlite3.connect(str(path))
  conn.execute("UPDATE meta SET value = '32' WHERE key = 'dim'")
  conn.execute("DROP TABLE buckets")
  conn.commit()
  conn.close()
  with pytest.raises(MemoryBankDatabaseError, match="table buckets is missing"):
    MemoryBank(str(path), HashEmbedder())


@pytest.mark.parametrize("vector, match", [
    (np.zeros(32), "is all zeros"),
    (np.full(32, 1e30), "outside float32's range"),
    (np.full(32, 1e-30), "outside float32's range"),
    (np.full(32, np.inf), "non-finite values"),
    (np.r_[np.nan, np.ones(31)], "non-finite values"),
])
def test_bad_embeddings_are_refused_at_insert_naming_the_field(tmp_path, vector, match):
  bank = _bank(tmp_path / "m.db", 1)
  good = HashEmbedder()
  bank.embedder = lambda texts: np.stack([vector if t == "bad text" else good([t])[0]
                                          for t in texts])
  with pytest.raises(MemoryBankError, match=rf"for question 'bad text'.*|question 'bad text'"):
    bank.add("bad text", "s", True, category="time")
  with pytest.raises(MemoryBankError, match=rf"caption 'bad text'"):
    bank.add("fine text", "s", True, category="time", caption="bad text")
  with pytest.raises(MemoryBankError, match=match):
    bank.add("bad text", "s", True, category="time")
  assert len(bank) == 1


def test_stored_nan_embedding_does_not_flatten_its_bucket(tmp_path):
  path = tmp_path / "m.db"
  bank = _bank(path, 6)
  before = bank.retrieve("where is place number 2 xq2", category="location")
  bank.close()
  conn = sqlite3.connect(str(path))
  nan = np.full(32, np.nan, np.float32).tobytes()
  conn.execute("UPDATE memories SET q_emb = ? WHERE id = 1", (nan,))
  conn.execute("UPDATE memories SET q_emb = ? WHERE id = 5", (b"\0\0",))  # wrong size
  conn.commit()
  conn.close()
  bank = _bank(path)
  found = bank.retrieve("where is place number 2 xq2", category="location")
  scores = [s.score for s in found.correct + found.incorrect]
  assert all(np.isfinite(scores)) and len(set(scores)) > 1, scores
  assert {s.memory.id for s in found.correct + found.incorrect}.isdisjoint({1, 5})
  assert found.correct[0].memory.id == before.correct[0].memory.id  # the best match survives
  assert bank.counters["bad_stored_embedding"] == 2
