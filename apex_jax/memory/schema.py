"""Vocabulary, config, errors and the SQLite schema (with migrations) of the memory bank.

Buckets are category x modality with the names of the APEx reference code (J-Ding519/APEx on
GitHub, Memory-Serve/memory_serve.py and TTRL/TTRL-nogt/local_search/skill_repository.py: ten
categories, "others" last, and the modalities "text-only" / "text-image").

The schema version lives in `PRAGMA user_version`; `MIGRATIONS[v]` takes a database from version v
to v + 1, each in its own transaction, so a crash between two steps leaves a valid older version
that the next open continues from.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any, NamedTuple

CATEGORIES = ("location", "human", "time", "career", "process", "definition", "event", "function",
              "property", "others")
MODALITIES = ("text-only", "text-image")
OUTCOMES = ("correct", "incorrect")


class MemoryBankError(Exception):
  """Bad input to the memory bank, or a database it cannot use; the message names the field or
  the file and the offending value."""


class MemoryBankDatabaseError(MemoryBankError):
  """An SQLite failure on the bank's file, named: `cause` is one of DATABASE_CAUSES."""

  def __init__(self, message: str, cause: str):
    super().__init__(message)
    self.cause = cause


DATABASE_CAUSES = ("locked", "disk_full", "corrupt", "io", "readonly", "cannot_open",
                   "constraint", "sqlite")
_CAUSES = {"SQLITE_BUSY": "locked", "SQLITE_LOCKED": "locked", "SQLITE_FULL": "disk_full",
           "SQLITE_CORRUPT": "corrupt", "SQLITE_NOTADB": "corrupt", "SQLITE_IOERR": "io",
           "SQLITE_READONLY": "readonly", "SQLITE_CANTOPEN": "cannot_open",
           "SQLITE_PERM": "readonly", "SQLITE_AUTH": "readonly",
           "SQLITE_CONSTRAINT": "constraint"}


def database_error(err: sqlite3.Error, path: str, timeout: float | None = None,
                   doing: str = "") -> MemoryBankDatabaseError:
  """A MemoryBankDatabaseError naming the file and the cause of an sqlite3 error."""
  name = getattr(err, "sqlite_errorname", "") or ""
  cause = _CAUSES.get("_".join(name.split("_")[:2]))  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
  text = str(err)
  if cause is None:  # errors raised without a code (e.g. by the module itself)
    low = text.lower()
    cause = ("locked" if "locked" in low or "busy" in low else
             "disk_full" if "full" in low else
             "corrupt" if "malformed" in low or "not a database" in low else "sqlite")
  during = f" while {doing}" if doing else ""
  if cause == "locked":
    waited = "" if timeout is None else f"; waited {timeout:g} s for the lock"
    message = (f"{path}: locked by another connection{during}{waited} ({text}). Another "
               f"process is writing the bank; retry, or open it with a longer timeout")
  elif cause == "disk_full":
    message = f"{path}: the disk is full{during} ({text}); nothing of this write was stored"
  elif cause == "corrupt":
    message = f"{path}: not a usable memory database: the file is damaged{during} ({text})"
  elif cause == "io":
    message = f"{path}: disk I/O error{during} ({text})"
  elif cause == "constraint":
    message = f"{path}: a constraint of the schema was violated{during} ({text})"
  elif cause in ("readonly", "cannot_open"):
    message = f"{path}: cannot {'write' if cause == 'readonly' else 'open'} the file{during} " \
              f"({text})"
  else:
    message = f"{path}: SQLite error{during} ({name or type(err).__name__}: {text})"
  return MemoryBankDatabaseError(message, cause)


class Bucket(NamedTuple):
  category: str
  modality: str

  def __str__(self) -> str:
    return f"{self.category}/{self.modality}"


def check_category(value: Any, field: str = "category") -> str:
  if not isinstance(value, str) or value not in CATEGORIES:
    raise MemoryBankError(f"{field} must be one of {', '.join(CATEGORIES)}; got {value!r}")
  return value


def check_modality(value: Any, field: str = "modality") -> str:
  if not isinstance(value, str) or value not in MODALITIES:
    raise MemoryBankError(f"{field} must be one of {', '.join(MODALITIES)}; got {value!r}")
  return value


def as_bucket(value: Any) -> Bucket:
  """A Bucket from a Bucket, a (category, modality) pair or the string 'category/modality'."""
  if isinstance(value, str) and value.count("/") == 1:
    value = tuple(value.split("/"))
  if not isinstance(value, tuple) or len(value) != 2:
    raise MemoryBankError(f"bucket must be (category, modality) or 'category/modality'; got "
                          f"{value!r}")
  return Bucket(check_category(value[0], "bucket category"),
                check_modality(value[1], "bucket modality"))


def as_outcome(value: Any, field: str = "outcome") -> str:
  """'correct' / 'incorrect' from a bool or one of those strings."""
  if isinstance(value, bool):
    return "correct" if value else "incorrect"
  if isinstance(value, str) and value in OUTCOMES:
    return value
  raise MemoryBankError(f"{field} must be True/False or one of {OUTCOMES}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  """Retrieval, dedup, skill and evolution constants. Defaults are the reference code's.

  beta, alpha: sim = beta cos(q, q_i) + (1 - beta) cos(c, c_i);  f = alpha sim~ + (1 - alpha) w_i.
  k / k_replan: memories per outcome class on the first plan / on a replan.
  faiss_threshold: buckets with at least this many memories are searched with faiss.
  dedup_threshold: sim at or above it makes a new memory a duplicate of the closest old one.
  dedup_gate: None (default) applies the dedup rule whatever the old memory's win rate, as
    Memory-Serve/memory_serve.py does; the reference code's TTRL servers
    (Serve/MIA-TTRL/agent_sever_ttrl_nogt*.py) apply it only below a win rate of 0.7 and keep both
    memories otherwise; set 0.7 for that.
  skill_evidence_n, skill_min_gamma: gamma = w min(n / N, 1); the skill is shown when gamma > min.
  evolve_every, evolve_min_size, evolve_window: a bucket of at least min_size memories is due for
    evolution once `every` new memories arrived since the last one; the batch is its last `window`.
  text_image: False keeps captions out of the bank (stored, routed and scored by the question
    alone, every memory text-only): the "without text-image memories" ablation.
  """
  beta: float = 0.8
  alpha: float = 0.7
  k: int = 2
  k_replan: int = 1
  faiss_threshold: int = 4096
  dedup_threshold: float = 0.9999
  dedup_gate: float | None = None
  skill_evidence_n: int = 10
  skill_min_gamma: float = 0.1
  evolve_every: int = 5
  evolve_min_size: int = 3
  evolve_window: int = 15
  text_image: bool = True

  def __post_init__(self):
    if not isinstance(self.text_image, bool):
      raise MemoryBankError(f"MemoryConfig.text_image must be a bool; got {self.text_image!r}")
    for name in ("beta", "alpha"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise MemoryBankError(f"MemoryConfig.{name} must be a number in [0, 1]; got {value!r}")
    for name in ("k", "k_replan", "faiss_threshold", "skill_evidence_n", "evolve_every",
                 "evolve_min_size", "evolve_window"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MemoryBankError(f"MemoryConfig.{name} must be an integer >= 1; got {value!r}")
    for name in ("dedup_threshold", "dedup_gate", "skill_min_gamma"):
      value = getattr(self, name)
      if value is None and name == "dedup_gate":
        continue
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemoryBankError(f"MemoryConfig.{name} must be a number; got {value!r}")


# ----------------------------------------------------------------------------------- schema


def _v1(cur: sqlite3.Cursor) -> None:
  """Memories, current skills and a key/value table (the embedding dimension)."""
  # AUTOINCREMENT: ids of replaced memories are never reused, so a stale id handed back to
  # record_outcome cannot update a different memory.
  cur.execute("""CREATE TABLE memories (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      category TEXT NOT NULL, modality TEXT NOT NULL,
      question TEXT NOT NULL, caption TEXT, workflow_summary TEXT NOT NULL,
      outcome TEXT NOT NULL CHECK (outcome IN ('correct', 'incorrect')),
      success_count INTEGER NOT NULL DEFAULT 1, usage_count INTEGER NOT NULL DEFAULT 1,
      q_emb BLOB NOT NULL, c_emb BLOB)""")
  cur.execute("CREATE INDEX memories_bucket ON memories (category, modality, id)")
  cur.execute("""CREATE TABLE skills (
      category TEXT NOT NULL, modality TEXT NOT NULL, doc TEXT NOT NULL,
      PRIMARY KEY (category, modality))""")
  cur.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


def _v2(cur: sqlite3.Cursor) -> None:
  """External data ids, every skill version, and per-bucket evolution state."""
  cur.execute("ALTER TABLE memories ADD COLUMN data_id TEXT")
  cur.execute("""CREATE TABLE skill_history (
      category TEXT NOT NULL, modality TEXT NOT NULL, version INTEGER NOT NULL, doc TEXT NOT NULL,
      PRIMARY KEY (category, modality, version))""")
  # evolved_upto_id: memories of the bucket with a larger id are evidence not yet distilled.
  cur.execute("""CREATE TABLE buckets (
      category TEXT NOT NULL, modality TEXT NOT NULL, evolved_upto_id INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (category, modality))""")
  # A v1 bank's current skills become the first entries of their history.
  for category, modality, doc in cur.execute("SELECT category, modality, doc FROM skills")\
      .fetchall():
    version = int(json.loads(doc).get("version", 1))
    cur.execute("INSERT INTO skill_history VALUES (?, ?, ?, ?)", (category, modality, version, doc))


MIGRATIONS = (_v1, _v2)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
  return conn.execute("PRAGMA user_version").fetchone()[0]


def _known_version(conn: sqlite3.Connection, path: str) -> int:
  """The file's schema version; MemoryBankError for one this code has no migration from (a
  newer file, or a value no version ever wrote: negative)."""
  version = user_version(conn)
  if version > SCHEMA_VERSION:
    raise MemoryBankError(f"{path}: schema version {version} is newer than this code's "
                          f"{SCHEMA_VERSION} (PRAGMA user_version; known versions 0 to "
                          f"{SCHEMA_VERSION}); upgrade apex_jax to open it")
  if version < 0:
    raise MemoryBankError(f"{path}: schema version (PRAGMA user_version) is {version}, which no "
                          f"version of apex_jax writes (known versions 0 to {SCHEMA_VERSION}): "
                          f"the file is damaged or not a memory database")
  return version


def migrate(conn: sqlite3.Connection, path: str, upto: int = SCHEMA_VERSION) -> int:
  """Brings the database to schema version `upto`, one transaction per step; returns it.

  The version is re-read under the write lock, so two processes opening a new file at once
  migrate it once. A file from a newer version of this code, one with a version no code wrote
  (negative), or another program's SQLite database, is refused, not touched.
  """
  # A read first: opening an up-to-date bank must not wait for (or take) the write lock.
  version = _known_version(conn, path)
  if version >= upto:
    return version
  while True:
    conn.execute("BEGIN IMMEDIATE")
    try:
      version = _known_version(conn, path)
      if version >= upto:
        conn.execute("COMMIT")
        return version
      if version == 0:  # a new file, or some other program's database: leave the latter alone
        other = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        if other:
          raise MemoryBankError(f"{path}: not a memory database (it has tables "
                                f"{', '.join(r[0] for r in other)} but no schema version)")
      MIGRATIONS[version](conn.cursor())
      conn.execute(f"PRAGMA user_version = {version + 1}")
      conn.execute("COMMIT")
    except BaseException:
      if conn.in_transaction:
        conn.execute("ROLLBACK")
      raise
