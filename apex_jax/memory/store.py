"""MemoryBank: APEx's instance memories and skill documents in one SQLite file.

- SQLite (standard library) in WAL mode: readers never block the writer. Every write is one
  `BEGIN IMMEDIATE ... COMMIT` transaction, so a batch lands whole or not at all, even if the
  process is killed in the middle of it. Embeddings are float32 blobs, stored as the embedder
  returned them.
- Retrieval reads a bucket's normalised embeddings once into a `BucketCache`; this connection's
  writes update the cache in place, and a commit by any other connection (seen through
  `PRAGMA data_version`) drops all caches. A bucket of `faiss_threshold` memories or more is
  searched with faiss IndexFlatIP, with results identical to numpy (see retrieval.py).
- Deduplication follows the reference code (J-Ding519/APEx, Memory-Serve/memory_serve.py,
  `MemoryProcessor.direct_store_memory`): the new memory's closest old one in the bucket (same sim
  as retrieval) is a duplicate at sim >= dedup_threshold (0.9999); the old one is then replaced
  when it was incorrect or when the new workflow summary has fewer words, and otherwise the new
  memory is dropped. With config.dedup_gate set (the TTRL servers use 0.7), an old memory whose
  win rate is at or above the gate is kept and the new one added too ('added_duplicate').

One bank may be shared by threads (calls are serialised by a lock); processes each open their own.

Failures of the file: every sqlite3 error, wherever it happens (open, read,
write, commit, a row fetched later), comes out as a `MemoryBankDatabaseError` (a MemoryBankError)
naming the file and the cause (`cause`: locked, disk_full, corrupt, io, readonly, cannot_open,
sqlite); "locked" names the timeout waited. Opening an up-to-date bank only reads (the write lock
is taken to create or migrate the schema, or to switch a file to WAL), checks the file with
`PRAGMA quick_check` and checks the schema's tables and columns and the stored dimension. A
stored embedding of the wrong size or not finite (a damaged or foreign file) is left out of
retrieval with a warning (counted in `counters["bad_stored_embedding"]`) instead of turning every
score of its bucket into NaN / 1.0. New embeddings are refused at insert when not finite, zero,
or with a norm float32 cannot hold, with an error naming the field and the text.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from morse_jax import atomic

from apex_jax.memory import exchange, skills
from apex_jax.memory.buckets import CentroidClassifier, modality_of
from apex_jax.memory.evolution import SkillOps
from apex_jax.memory.records import (AddResult, Memory, NewMemory, OutcomeResult, PlannerContext,
                                     Retrieval, ScoredMemory, initial_success)
from apex_jax.memory.retrieval import BucketCache, rank, unit
from apex_jax.memory.schema import (Bucket, MemoryBankDatabaseError, MemoryBankError,
                                    MemoryConfig, as_bucket, as_outcome, check_category,
                                    check_modality, database_error, migrate)

log = logging.getLogger(__name__)

_MEMORY_COLUMNS = ("id, category, modality, question, workflow_summary, outcome, success_count, "
                   "usage_count, caption, data_id")


class _Cursor(sqlite3.Cursor):
  """A cursor whose sqlite3 errors come out as MemoryBankDatabaseError (see the docstring)."""

  def _fail(self, err: sqlite3.Error, doing: str):
    conn = self.connection
    return database_error(err, conn.bank_path, conn.bank_timeout, doing)

  def execute(self, sql, *args):
    try:
      return super().execute(sql, *args)
    except sqlite3.Error as err:
      raise self._fail(err, f"running {sql.split(None, 2)[:2]}") from err

  def executemany(self, sql, *args):
    try:
      return super().executemany(sql, *args)
    except sqlite3.Error as err:
      raise self._fail(err, f"running {sql.split(None, 2)[:2]}") from err

  def fetchone(self):
    try:
      return super().fetchone()
    except sqlite3.Error as err:
      raise self._fail(err, "reading rows") from err

  def fetchall(self):
    try:
      return super().fetchall()
    except sqlite3.Error as err:
      raise self._fail(err, "reading rows") from err

  def fetchmany(self, *args):
    try:
      return super().fetchmany(*args)
    except sqlite3.Error as err:
      raise self._fail(err, "reading rows") from err

  def __next__(self):
    try:
      return super().__next__()
    except sqlite3.Error as err:
      raise self._fail(err, "reading rows") from err


class _Connection(sqlite3.Connection):
  """Every statement runs on a _Cursor (the C Connection.execute would bypass `cursor()`)."""
  bank_path = ""
  bank_timeout: float | None = None

  def cursor(self, factory=_Cursor):
    return super().cursor(factory)

  def execute(self, sql, parameters=()):
    return self.cursor().execute(sql, parameters)

  def executemany(self, sql, parameters):
    return self.cursor().executemany(sql, parameters)

  def close(self):
    try:
      super().close()
    except sqlite3.Error as err:
      raise database_error(err, self.bank_path, self.bank_timeout, "closing") from err


# table -> columns the code reads (an older or foreign file lacking one is refused at open)
_SCHEMA = {"memories": ("id", "category", "modality", "question", "caption", "workflow_summary",
                        "outcome", "success_count", "usage_count", "q_emb", "c_emb", "data_id"),
           "skills": ("category", "modality", "doc"), "meta": ("key", "value"),
           "skill_history": ("category", "modality", "version", "doc"),
           "buckets": ("category", "modality", "evolved_upto_id")}


def _text(value: Any, field: str, allow_empty: bool = False) -> str:
  if not isinstance(value, str) or (not allow_empty and not value.strip()):
    raise MemoryBankError(f"{field} must be a {'' if allow_empty else 'non-empty '}string; got "
                          f"{value!r}")
  return value


def _caption(value: Any, field: str = "caption") -> str | None:
  if value is None:
    return None
  return _text(value, field, allow_empty=True) if value.strip() else None


class MemoryBank(SkillOps):
  """Experience memory of APEx; see the module docstring. `embedder(texts) -> [n, d]`."""

  def __init__(self, path: str, embedder: Callable[[Sequence[str]], Any], *,
               config: MemoryConfig | None = None,
               classifier: Callable[[str], str] | None = None, timeout: float = 30.0):
    self.path = str(path)
    self.embedder = embedder
    self.config = config if config is not None else MemoryConfig()
    if not isinstance(self.config, MemoryConfig):
      raise MemoryBankError(f"config must be a MemoryConfig; got {config!r}")
    self._classifier = classifier
    self.counters: collections.Counter[str] = collections.Counter()
    self.distiller_errors: collections.Counter[str] = collections.Counter()
    self.unknown_absorbed_ids = 0  # absorbed ids outside the batch, dropped from applied replies
    self.bucket_overwrites = 0  # skill category / modality fields overwritten with the bucket's
    self.after_insert: Callable[[int], None] | None = None  # called per row inside a batch
    self._lock = threading.RLock()
    self._caches: dict[Bucket, BucketCache] = {}
    self._cache_changed = False
    self._conn = self._open(timeout)
    self._data_version = self._conn.execute("PRAGMA data_version").fetchone()[0]
    self.dim = self._stored_dim()

  def _open(self, timeout: float) -> sqlite3.Connection:
    try:
      conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                             check_same_thread=False, factory=_Connection)
    except sqlite3.Error as err:
      raise database_error(err, self.path, timeout, "opening") from err
    conn.bank_path, conn.bank_timeout = self.path, timeout
    try:
      # Only a file not yet in WAL mode needs the lock that switching takes.
      if self.path != ":memory:" and \
          str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
      conn.execute("PRAGMA synchronous = FULL")
      migrate(conn, self.path)
      self._check_file(conn)
    except BaseException:
      try:
        conn.close()
      except MemoryBankError:
        pass
      raise
    return conn

  def _check_file(self, conn: sqlite3.Connection) -> None:
    """quick_check, the schema's tables and columns, and the stored dimension."""
    problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
      raise MemoryBankDatabaseError(f"{self.path}: not a usable memory database: the file is "
                                    f"damaged (quick_check: {'; '.join(problems[:3])})",
                                    "corrupt")
    for table, columns in _SCHEMA.items():
      have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}
      missing = [c for c in columns if c not in have]
      if missing:
        raise MemoryBankDatabaseError(
            f"{self.path}: not a usable memory database: table {table} "
            f"{'is missing' if not have else 'lacks column(s) ' + ', '.join(missing)}", "corrupt")
    row = conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
    if row is not None and not (isinstance(row[0], str) and row[0].isascii() and
                                row[0].isdigit() and 0 < int(row[0]) < 1 << 20):
      raise MemoryBankDatabaseError(f"{self.path}: not a usable memory database: stored "
                                    f"embedding dim {row[0]!r} is not a positive integer",
                                    "corrupt")

  def close(self) -> None:
    with self._lock:
      self._conn.close()

  def __enter__(self) -> "MemoryBank":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ------------------------------------------------------------------------- internals

  def _stored_dim(self) -> int | None:
    row = self._conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
    return int(row[0]) if row else None

  def _sync(self) -> None:
    """Drops the caches when another connection has committed since we last looked."""
    version = self._conn.execute("PRAGMA data_version").fetchone()[0]
    if version != self._data_version:
      self._caches.clear()
      self._data_version = version
      self.dim = self._stored_dim()

  @contextlib.contextmanager
  def _txn(self, write: bool):
    """One transaction under the lock. If a write fails after it changed a cache (the cache
    runs ahead of the commit), all caches are dropped and reload from the rolled-back file."""
    with self._lock:
      self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
      self._cache_changed = False
      try:
        self._sync()
        yield self._conn
        self._conn.execute("COMMIT")
      except BaseException:
        if self._conn.in_transaction:
          self._conn.execute("ROLLBACK")
        if self._cache_changed:
          self._caches.clear()
        if write:
          self.dim = self._stored_dim()
        raise

  def _cache(self, bucket: Bucket) -> BucketCache:
    cache = self._caches.get(bucket)
    if cache is None:
      rows = self._conn.execute(
          "SELECT id, q_emb, c_emb, outcome, success_count, usage_count FROM memories "
          "WHERE category = ? AND modality = ? ORDER BY id", bucket).fetchall()
      rows = [r for r in rows if self._good_stored_row(r)]
      cache = self._caches[bucket] = BucketCache.from_rows(self.dim or 1, rows)
    return cache

  def _good_stored_row(self, row) -> bool:
    """Whether a stored memory's embeddings can be scored: blobs of dim float32 values, finite,
    not zero. Others (a damaged or foreign file; this code never writes them) are left out of
    retrieval with a warning, not allowed to turn every score of the bucket into NaN / 1.0."""
    size = 4 * (self.dim or 1)
    for name, blob in (("q_emb", row[1]), ("c_emb", row[2])):
      if blob is None and name == "c_emb":
        continue
      reason = None
      if not isinstance(blob, bytes) or len(blob) != size:
        reason = f"is {len(blob) if isinstance(blob, bytes) else type(blob).__name__} bytes, " \
                 f"not {size}"
      else:
        v = np.frombuffer(blob, np.float32)
        if not np.isfinite(v).all():
          reason = "holds NaN or infinity"
        elif not np.isfinite(np.linalg.norm(v)) or not np.any(v):
          reason = "is zero or its norm overflows float32"
      if reason:
        self.counters["bad_stored_embedding"] += 1
        log.warning("%s: memory %s's %s %s; left out of retrieval", self.path, row[0], name,
                    reason)
        return False
    return True

  def _embed(self, texts: list[str], field: str) -> np.ndarray:
    """[n, d] float32 from the embedder, checked: shape, finiteness, the bank's dimension."""
    if not texts:
      return np.zeros((0, self.dim or 0), np.float32)
    raw = self.embedder(list(texts))
    try:
      out = np.asarray(raw, np.float32)
    except (TypeError, ValueError) as err:
      raise MemoryBankError(f"embedder output for {field} texts is not a numeric array "
                            f"({err})") from err
    if out.ndim != 2 or out.shape[0] != len(texts) or out.shape[1] == 0:
      raise MemoryBankError(f"embedder returned shape {out.shape} for {len(texts)} {field} "
                            f"texts; expected [{len(texts)}, d]")
    bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
    if bad.size:
      raise MemoryBankError(f"embedder returned non-finite values for {field} "
                            f"{texts[bad[0]]!r}")
    # Embeddings need not be unit-norm (stored as returned, normalised when scored: unit()),
    # but a zero vector has no direction, and a norm float32 cannot hold becomes 0 or inf.
    with np.errstate(over="ignore", under="ignore"):
      norms = np.linalg.norm(out, axis=1)
    bad = np.flatnonzero(~np.isfinite(norms) | (norms < np.finfo(np.float32).tiny))
    if bad.size:
      what = "is all zeros" if not np.any(out[bad[0]]) else \
          f"has norm {float(np.linalg.norm(out[bad[0]].astype(np.float64))):.3g}, outside " \
          f"float32's range"
      raise MemoryBankError(f"embedder output for {field} {texts[bad[0]]!r} {what}: not a "
                            f"usable embedding")
    if self.dim is not None and out.shape[1] != self.dim:
      raise MemoryBankError(f"embedding dim {out.shape[1]} of {field} texts does not match the "
                            f"bank's dim {self.dim} ({self.path})")
    return out

  def _caption(self, value, field: str = "caption") -> str | None:
    """A checked caption, or None when the config keeps captions out (`text_image` False)."""
    caption = _caption(value, field)
    return caption if self.config.text_image else None

  def _route(self, question: str, caption: str | None, category, modality) -> Bucket:
    if not self.config.text_image:  # every memory text-only: one bucket per category
      modality = None
    modality = modality_of(caption) if modality is None else check_modality(modality)
    if category is None:
      if self._classifier is None:
        self._classifier = CentroidClassifier(self.embedder)
      category = self._classifier(question)
    return Bucket(check_category(category), modality)

  def _fetch(self, ids: Iterable[int]) -> dict[int, Memory]:
    ids = list(ids)
    out = {}
    for start in range(0, len(ids), 500):
      chunk = ids[start:start + 500]
      marks = ",".join("?" * len(chunk))
      for row in self._conn.execute(
          f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id IN ({marks})", chunk):
        out[row[0]] = Memory(*row)
    return out

  # ---------------------------------------------------------------------------- adding

  def _prepare(self, index: int, item: NewMemory | Mapping) -> tuple[NewMemory, Bucket]:
    where = f"memory {index}"
    if isinstance(item, Mapping):
      unknown = set(item) - {f.name for f in dataclasses.fields(NewMemory)}
      if unknown:
        raise MemoryBankError(f"{where}: unknown field {sorted(unknown)[0]!r}")
      try:
        item = NewMemory(**item)
      except TypeError as err:
        raise MemoryBankError(f"{where}: {err}") from err
    if not isinstance(item, NewMemory):
      raise MemoryBankError(f"{where}: expected a NewMemory or a mapping; got {item!r}")
    caption = self._caption(item.caption, f"{where}: caption")
    data_id = item.data_id
    if data_id is not None and (isinstance(data_id, bool) or not isinstance(data_id, (str, int))):
      raise MemoryBankError(f"{where}: data_id must be a string; got {data_id!r}")
    clean = NewMemory(_text(item.question, f"{where}: question"),
                      _text(item.workflow_summary, f"{where}: workflow_summary", True),
                      as_outcome(item.outcome, f"{where}: outcome"), item.category,
                      item.modality, caption, None if data_id is None else str(data_id))
    return clean, self._route(clean.question, caption, item.category, item.modality)

  def add(self, question: str, workflow_summary: str, outcome: bool | str, *,
          category: str | None = None, modality: str | None = None,
          caption: str | None = None, data_id: str | None = None) -> AddResult:
    """Stores one memory (deduplicated); outcome True/'correct' or False/'incorrect'."""
    return self.add_many([NewMemory(question, workflow_summary, outcome, category, modality,
                                    caption, data_id)])[0]

  def add_many(self, items: Sequence[NewMemory | Mapping], *,
               dedup: bool = True) -> list[AddResult]:
    """Stores a batch in one transaction, each item deduplicated against the bucket as it stands
    after the items before it. Embeds everything first, so the write lock is held briefly."""
    prepared = [self._prepare(i, item) for i, item in enumerate(items)]
    if not prepared:
      return []
    q_emb = self._embed([m.question for m, _ in prepared], "question")
    with_caption = [i for i, (m, _) in enumerate(prepared) if m.caption is not None]
    c_emb = self._embed([prepared[i][0].caption for i in with_caption], "caption")
    c_of = dict(zip(with_caption, c_emb))
    results = []
    with self._txn(write=True) as conn:
      if self.dim is None:
        self.dim = int(q_emb.shape[1])
        conn.execute("INSERT INTO meta VALUES ('dim', ?)", (str(self.dim),))
      elif q_emb.shape[1] != self.dim:  # the bank got its dim from another process meanwhile
        raise MemoryBankError(f"embedding dim {q_emb.shape[1]} does not match the bank's dim "
                              f"{self.dim} ({self.path})")
      for i, (mem, bucket) in enumerate(prepared):
        results.append(self._insert(conn, mem, bucket, q_emb[i], c_of.get(i), dedup))
      self.counters.update(r.action for r in results)
    return results

  def _insert(self, conn, mem: NewMemory, bucket: Bucket, q_raw, c_raw, dedup) -> AddResult:
    cache = self._cache(bucket)
    q, c = unit(q_raw), (None if c_raw is None else unit(c_raw))
    action, old_id, best = "added", None, None
    if dedup and cache.n:
      sims = cache.sims(q, c, self.config.beta)
      best = float(sims.max())
      if best >= self.config.dedup_threshold:
        old_id = int(cache.ids[:cache.n][sims == best].min())
        old = self._fetch([old_id])[old_id]
        gate = self.config.dedup_gate
        if gate is not None and old.win_rate >= gate:
          action = "added_duplicate"
        elif (not old.correct or
              len(mem.workflow_summary.split()) < len(old.workflow_summary.split())):
          action = "replaced"
        else:
          return AddResult("dropped", None, old_id, best)
    if action == "replaced":
      conn.execute("DELETE FROM memories WHERE id = ?", (old_id,))
    correct = mem.outcome == "correct"
    # The episode that made it is its first use: a win (1 / 1) or a loss (0 / 1).
    success = initial_success(correct)
    cur = conn.execute(
        "INSERT INTO memories (category, modality, question, caption, workflow_summary, outcome,"
        " success_count, usage_count, q_emb, c_emb, data_id) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
        (*bucket, mem.question, mem.caption, mem.workflow_summary, mem.outcome, success,
         np.asarray(q_raw, np.float32).tobytes(),
         None if c_raw is None else np.asarray(c_raw, np.float32).tobytes(), mem.data_id))
    new_id = cur.lastrowid
    self._cache_changed = True
    if action == "replaced":
      cache.replace(old_id, new_id, q, c, correct, success=success)
    else:
      cache.append(new_id, q, c, correct, success=success)
    if self.after_insert is not None:
      self.after_insert(new_id)
    return AddResult(action, new_id, old_id, best)

  # ------------------------------------------------------------------------- retrieval

  def retrieve(self, question: str, caption: str | None = None, *, category: str | None = None,
               modality: str | None = None, k: int | None = None,
               replan: bool = False) -> Retrieval:
    """Top-k correct and top-k incorrect memories of the question's bucket, each best first
    (k defaults to config.k, or config.k_replan when replan). Formulas: retrieval.py."""
    question = _text(question, "question")
    caption = self._caption(caption)
    bucket = self._route(question, caption, category, modality)
    k = (self.config.k_replan if replan else self.config.k) if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise MemoryBankError(f"k must be an integer >= 1; got {k!r}")
    with self._lock:
      self._sync()
      if self.dim is None:  # nothing stored yet
        return Retrieval(bucket, (), ())
    q = unit(self._embed([question], "question")[0])
    c = None if caption is None else unit(self._embed([caption], "caption")[0])
    with self._txn(write=False):
      cache = self._cache(bucket)
      use_faiss = cache.n >= self.config.faiss_threshold
      ranked = rank(cache, q, c, beta=self.config.beta, alpha=self.config.alpha, k=k,
                    use_faiss=use_faiss)
      found = self._fetch(int(cache.ids[r]) for part in ranked for r in part.rows)
      return Retrieval(bucket, *(tuple(
          ScoredMemory(found[int(cache.ids[r])], float(f), float(s), float(sn))
          for r, f, s, sn in zip(part.rows, part.score, part.sim, part.sim_norm))
          for part in ranked))

  def planner_context(self, question: str, caption: str | None = None, *,
                      category: str | None = None, modality: str | None = None,
                      k: int | None = None, replan: bool = False, use_memories: bool = True,
                      use_skills: bool = True) -> PlannerContext:
    """E(q) = the bucket's skill (only when gamma > config.skill_min_gamma) + the retrieved
    memories, as text in the reference code's layout (Serve/MIA-TTRL/
    agent_sever_ttrl_nogt_skill.py, the /memory route: skill section, memories, stripped).
    The ablations: use_memories=False shows no instance memory (the memory section reads
    "None found", no ids), use_skills=False no skill document (gamma 0); the bucket is routed
    as always."""
    if use_memories:
      found = self.retrieve(question, caption, category=category, modality=modality, k=k,
                            replan=replan)
    else:
      question, caption = _text(question, "question"), self._caption(caption)
      found = Retrieval(self._route(question, caption, category, modality), (), ())
    skill = self.get_skill(found.bucket) if use_skills else None
    gamma = 0.0 if skill is None else skills.confidence(skill.win_rate, skill.evidence_count,
                                                        self.config.skill_evidence_n)
    shown = skill if skill is not None and gamma > self.config.skill_min_gamma else None
    text = skills.render_memories([s.memory for s in found.correct],
                                  [s.memory for s in found.incorrect])
    if shown is not None:
      text = skills.render_skill(shown, gamma) + text
    return PlannerContext(text.strip(), found.bucket, found.memory_ids, shown, gamma)

  def record_outcome(self, memory_ids: Iterable[int], correct: bool | str) -> OutcomeResult:
    """After judgement, for the memories that were used: usage += 1, success += correct.
    Each id counts once per call; ids no longer stored are reported (and counted), not fatal."""
    ids = []
    for value in memory_ids:
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise MemoryBankError(f"memory id must be an integer; got {value!r}")
      ids.append(int(value))
    ids = list(dict.fromkeys(ids))
    gain = int(as_outcome(correct, "correct") == "correct")
    with self._txn(write=True) as conn:
      found = self._fetch(ids)
      conn.executemany("UPDATE memories SET usage_count = usage_count + 1, "
                       "success_count = success_count + ? WHERE id = ?",
                       [(gain, i) for i in found])
      self._cache_changed = True
      for m in found.values():
        if m.bucket in self._caches:
          self._caches[m.bucket].set_counts(m.id, m.success_count + gain, m.usage_count + 1)
      missing = tuple(i for i in ids if i not in found)
      self.counters["outcome_missing_id"] += len(missing)
    return OutcomeResult(tuple(found), missing)

  def set_summary(self, memory_id: int, workflow_summary: str) -> bool:
    """Rewrites a stored memory's workflow summary (ExpeL's EDIT of a memory's rule,
    apex_jax.baselines.expel); False when no memory has that id. Its embeddings, outcome and
    counts stay."""
    text = _text(workflow_summary, "workflow_summary")
    with self._txn(write=True) as conn:
      cur = conn.execute("UPDATE memories SET workflow_summary = ? WHERE id = ?",
                         (text, int(memory_id)))
      return cur.rowcount == 1

  # ------------------------------------------------------------------------ inspection

  def __len__(self) -> int:
    with self._lock:
      return self._conn.execute("SELECT count(*) FROM memories").fetchone()[0]

  def count(self, bucket) -> int:
    bucket = as_bucket(bucket)
    with self._lock:
      return self._conn.execute("SELECT count(*) FROM memories WHERE category = ? AND "
                                "modality = ?", bucket).fetchone()[0]

  def get(self, memory_id: int) -> Memory | None:
    with self._lock:
      return self._fetch([memory_id]).get(memory_id)

  def memories(self, bucket, *, last: int | None = None) -> list[Memory]:
    """The bucket's memories oldest first (only the newest `last` when given)."""
    bucket = as_bucket(bucket)
    limit = -1 if last is None else last
    with self._lock:
      rows = self._conn.execute(
          f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE category = ? AND modality = ? "
          f"ORDER BY id DESC LIMIT ?", (*bucket, limit)).fetchall()
    return [Memory(*r) for r in reversed(rows)]

  # ------------------------------------------------------------------------- snapshots

  def snapshot(self, path: str) -> str:
    """A consistent copy of the bank at this moment (sqlite3's online backup API, under the
    lock, so no write of this bank lands half in it) written to `path` atomically (a temporary
    file in the same folder, fsynced, renamed) as a plain rollback-journal file. Returns the
    copy's sha256. Resumable runs keep one per checkpoint step (morse_jax/checkpoint/sidecar.py)."""
    def fill(tmp):
      dest = sqlite3.connect(tmp, isolation_level=None)
      try:
        with self._lock:
          try:
            self._conn.backup(dest)
          except sqlite3.Error as err:
            raise database_error(err, self.path, None, "snapshotting") from err
        dest.execute("PRAGMA journal_mode = DELETE")
      finally:
        dest.close()
      return atomic.file_sha256(tmp)

    return atomic.replace_with(path, fill, prefix=".bank.")

  def backup(self, path: str) -> str:
    """A consistent copy of the whole bank at `path` (`snapshot`), e.g. the bank as it stood
    before TTRL for the ablations; open it with `MemoryBank(path, embedder)`. Returns path."""
    path = str(path)
    if os.path.abspath(path) == os.path.abspath(self.path):
      raise MemoryBankError(f"backup: {path} is the bank's own file")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for stale in (path + "-wal", path + "-shm", path + "-journal"):
      if os.path.exists(stale):
        os.remove(stale)
    self.snapshot(path)
    return path

  def restore_snapshot(self, path: str, sha256: str | None = None) -> None:
    """Replaces the bank's whole contents with a `snapshot` file (through the backup API, into
    this open connection, so every holder of this bank sees it), after checking its sha256
    when given: a damaged copy raises MemoryBankDatabaseError ('corrupt') and leaves the bank
    as it was."""
    if not os.path.isfile(path):
      raise MemoryBankDatabaseError(f"{path}: memory bank snapshot is missing", "corrupt")
    if sha256 is not None and atomic.file_sha256(path) != sha256:
      raise MemoryBankDatabaseError(f"{path}: memory bank snapshot does not match its sha256 "
                                    f"{sha256[:16]}: the file is damaged", "corrupt")
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
      with self._lock:
        try:
          src.backup(self._conn)
        except sqlite3.Error as err:
          raise database_error(err, self.path, None, "restoring a snapshot") from err
        self._caches.clear()
        self.dim = self._stored_dim()
        self._data_version = self._conn.execute("PRAGMA data_version").fetchone()[0]
    finally:
      src.close()

  def counters_state(self) -> dict:
    """This object's counts (not in the file): what a resumed run must carry on from."""
    return {"counters": dict(self.counters), "distiller_errors": dict(self.distiller_errors),
            "unknown_absorbed_ids": self.unknown_absorbed_ids,
            "bucket_overwrites": self.bucket_overwrites}

  def load_counters_state(self, state: Mapping) -> None:
    self.counters = collections.Counter(state.get("counters", {}))
    self.distiller_errors = collections.Counter(state.get("distiller_errors", {}))
    self.unknown_absorbed_ids = int(state.get("unknown_absorbed_ids", 0))
    self.bucket_overwrites = int(state.get("bucket_overwrites", 0))

  # ------------------------------------------------------------------------------ JSON

  def export_json(self, path: str) -> None:
    """Everything (memories with embeddings, skills with history, evolution state) to a JSON
    file, written atomically. import_json of it restores the bank exactly."""
    with self._txn(write=False) as conn:
      data = exchange.dump(conn)
    exchange.write_atomic(path, data)

  def import_json(self, path: str, *, replace: bool = False) -> int:
    """Loads an export in one transaction; the bank must be empty unless replace=True (which
    deletes its contents first). Returns the number of memories loaded."""
    data = exchange.read(path)
    with self._txn(write=True) as conn:
      count = exchange.load(conn, data, path, replace=replace)
      self._caches.clear()
      self.dim = self._stored_dim()
    return count
