"""JSON export and import of a whole memory bank.

Embeddings are written as lists of numbers: a float32 widened to a Python float and printed with
repr reads back to the same float32, so export -> import -> export is byte-for-byte the same.
Ids, counts, skills (with every version) and evolution state are kept, and so is the next id, so
ids of deleted memories stay unused after a round trip. Every field is checked on import, and a
bad one is reported with its path in the file (e.g. memories[3].outcome) and its value.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from apex_jax.memory.schema import (OUTCOMES, SCHEMA_VERSION, MemoryBankDatabaseError,
                                    MemoryBankError, check_category, check_modality)
from apex_jax.memory.skills import skill_from_doc, skill_to_doc
from morse_jax import atomic

FORMAT = "apex_jax.memory"
FORMAT_VERSION = 1


def _vector(blob: bytes | None) -> list[float] | None:
  return None if blob is None else np.frombuffer(blob, np.float32).tolist()


def dump(conn: sqlite3.Connection) -> dict[str, Any]:
  """The bank's contents as a JSON-ready dict (call inside a read transaction)."""
  dim = conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
  seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'").fetchone()
  memories = [{
      "id": r[0], "category": r[1], "modality": r[2], "question": r[3], "caption": r[4],
      "workflow_summary": r[5], "outcome": r[6], "success_count": r[7], "usage_count": r[8],
      "data_id": r[9], "question_embedding": _vector(r[10]), "caption_embedding": _vector(r[11]),
  } for r in conn.execute(
      "SELECT id, category, modality, question, caption, workflow_summary, outcome, "
      "success_count, usage_count, data_id, q_emb, c_emb FROM memories ORDER BY id")]
  return {
      "format": FORMAT, "format_version": FORMAT_VERSION, "schema_version": SCHEMA_VERSION,
      "dim": None if dim is None else int(dim[0]), "next_id": (seq[0] if seq else 0) + 1,
      "memories": memories,
      "skills": [json.loads(r[0]) for r in conn.execute(
          "SELECT doc FROM skills ORDER BY category, modality")],
      "skill_history": [json.loads(r[0]) for r in conn.execute(
          "SELECT doc FROM skill_history ORDER BY category, modality, version")],
      "buckets": [{"category": r[0], "modality": r[1], "evolved_upto_id": r[2]}
                  for r in conn.execute("SELECT * FROM buckets ORDER BY category, modality")],
  }


def write_atomic(path: str, data: dict) -> None:
  """Writes the JSON to a temporary file in the same folder, fsyncs, then renames over `path`."""
  atomic.write_text(path, json.dumps(data, ensure_ascii=False, allow_nan=False), ".memory.")


def read(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
    raise MemoryBankError(f"{path}: cannot read a memory export ({err})") from err
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise MemoryBankError(f"{path}: not a memory export (format {FORMAT!r} expected)")
  if data.get("format_version") != FORMAT_VERSION:
    raise MemoryBankError(f"{path}: export format_version {data.get('format_version')!r} is not "
                          f"{FORMAT_VERSION}")
  return data


def _int(obj: dict, key: str, where: str, low: int) -> int:
  value = obj.get(key)
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise MemoryBankError(f"{where}.{key} must be an integer >= {low}; got {value!r}")
  return value


def _str(obj: dict, key: str, where: str, optional: bool = False) -> str | None:
  value = obj.get(key)
  if value is None and optional:
    return None
  if not isinstance(value, str):
    raise MemoryBankError(f"{where}.{key} must be a string; got {value!r}")
  return value


def _blob(obj: dict, key: str, where: str, dim: int, optional: bool) -> bytes | None:
  value = obj.get(key)
  if value is None and optional:
    return None
  if (not isinstance(value, list) or len(value) != dim or
      not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
    raise MemoryBankError(f"{where}.{key} must be a list of {dim} numbers; got "
                          f"{str(value)[:80]}")
  arr = np.asarray(value, np.float32)
  if not np.isfinite(arr).all():
    raise MemoryBankError(f"{where}.{key} holds a non-finite value")
  return arr.tobytes()


def _memory_row(m: Any, where: str, dim: int) -> tuple:
  if not isinstance(m, dict):
    raise MemoryBankError(f"{where} must be an object; got {m!r}")
  outcome = _str(m, "outcome", where)
  if outcome not in OUTCOMES:
    raise MemoryBankError(f"{where}.outcome must be one of {OUTCOMES}; got {outcome!r}")
  success, usage = _int(m, "success_count", where, 0), _int(m, "usage_count", where, 1)
  if success > usage:
    raise MemoryBankError(f"{where}: success_count {success} exceeds usage_count {usage}")
  caption = _str(m, "caption", where, optional=True)
  c_blob = _blob(m, "caption_embedding", where, dim, optional=True)
  if (caption is None) != (c_blob is None):
    raise MemoryBankError(f"{where}: caption and caption_embedding must both be present or "
                          f"both null")
  return (_int(m, "id", where, 1), check_category(m.get("category"), f"{where}.category"),
          check_modality(m.get("modality"), f"{where}.modality"), _str(m, "question", where),
          caption, _str(m, "workflow_summary", where), outcome, success, usage,
          _blob(m, "question_embedding", where, dim, optional=False), c_blob,
          _str(m, "data_id", where, optional=True))


def _skill_row(d: Any, where: str) -> tuple[str, str, int, str]:
  """(category, modality, version, normalised doc) of an exported skill document."""
  if not isinstance(d, dict):
    raise MemoryBankError(f"{where} must be an object; got {d!r}")
  try:
    skill = skill_from_doc(json.dumps(d))
  except (KeyError, TypeError, AttributeError, ValueError) as err:
    raise MemoryBankError(f"{where} is not a skill document ({err!r})") from err
  check_category(skill.category, f"{where}.category")
  check_modality(skill.modality, f"{where}.modality")
  _int(d, "version", where, 1)
  return skill.category, skill.modality, skill.version, skill_to_doc(skill)


def load(conn: sqlite3.Connection, data: dict, path: str, *, replace: bool) -> int:
  """Inserts an export read by `read` (call inside a write transaction); returns the count."""
  if not replace and (conn.execute("SELECT count(*) FROM memories").fetchone()[0] or
                      conn.execute("SELECT count(*) FROM skills").fetchone()[0]):
    raise MemoryBankError(f"cannot import {path}: the bank is not empty (pass replace=True)")
  memories = data.get("memories")
  if not isinstance(memories, list):
    raise MemoryBankError(f"{path}: memories must be a list; got {memories!r}")
  dim = data.get("dim")
  if memories or dim is not None:
    dim = _int(data, "dim", f"{path}: export", 1)
  rows = [_memory_row(m, f"{path}: memories[{i}]", dim) for i, m in enumerate(memories)]
  ids = [r[0] for r in rows]
  if len(set(ids)) != len(ids):
    raise MemoryBankError(f"{path}: memory ids are not unique")
  next_id = _int(data, "next_id", f"{path}: export", max(ids, default=0) + 1)
  skill_rows = [_skill_row(d, f"{path}: skills[{i}]") for i, d in
                enumerate(data.get("skills") or [])]
  history = [_skill_row(d, f"{path}: skill_history[{i}]") for i, d in
             enumerate(data.get("skill_history") or [])]
  buckets = []
  for i, b in enumerate(data.get("buckets") or []):
    where = f"{path}: buckets[{i}]"
    if not isinstance(b, dict):
      raise MemoryBankError(f"{where} must be an object; got {b!r}")
    buckets.append((check_category(b.get("category"), f"{where}.category"),
                    check_modality(b.get("modality"), f"{where}.modality"),
                    _int(b, "evolved_upto_id", where, 0)))
  for table in ("memories", "skills", "skill_history", "buckets", "meta"):
    conn.execute(f"DELETE FROM {table}")
  if dim is not None:
    conn.execute("INSERT INTO meta VALUES ('dim', ?)", (str(dim),))
  try:
    conn.executemany(
        "INSERT INTO memories (id, category, modality, question, caption, workflow_summary, "
        "outcome, success_count, usage_count, q_emb, c_emb, data_id) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.executemany("INSERT INTO skills VALUES (?, ?, ?)",
                     [(c, m, d) for c, m, _, d in skill_rows])
    conn.executemany("INSERT INTO skill_history VALUES (?, ?, ?, ?)", history)
    conn.executemany("INSERT INTO buckets VALUES (?, ?, ?)", buckets)
  except sqlite3.IntegrityError as err:  # e.g. two skills for one bucket (a plain connection)
    raise MemoryBankError(f"{path}: inconsistent export ({err})") from err
  except MemoryBankDatabaseError as err:  # the bank's connection names its sqlite3 errors
    if err.cause != "constraint":
      raise
    raise MemoryBankError(f"{path}: inconsistent export ({err.__cause__})") from err
  # Inserting explicit ids moved the sequence to the largest one; the export's next id may be
  # higher (memories deleted before the export), and must win.
  conn.execute("DELETE FROM sqlite_sequence WHERE name = 'memories'")
  conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('memories', ?)", (next_id - 1,))
  return len(rows)
