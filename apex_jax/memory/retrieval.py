"""Scoring a bucket against a query (paper Appendix A), exactly, with numpy or faiss.

For memory i of the bucket, with unit question embeddings q, q_i and caption embeddings c, c_i:

  sim_i  = beta cos(q, q_i) + (1 - beta) cos(c, c_i)   when the query and memory i both have a
           caption, else cos(q, q_i)
  sim~_i = (sim_i - min_j sim_j) / (max_j sim_j - min_j sim_j)    over the whole bucket, both
           outcome classes together; when max - min <= 1e-9 (all equal) sim~_i = 1 for every i,
           i.e. every memory is as close as the closest one
  f_i    = alpha sim~_i + (1 - alpha) w_i,  w_i = success_i / usage_i

and the top k correct and the top k incorrect memories by f are returned separately, ties to the
smaller (older) id. A zero embedding has cosine 0 with everything.

The reference code (Memory-Serve `retrieve_balanced_memories`) divides by (max - min + 1e-8), which
makes an all-equal bucket score sim~ = 0; the exact formula and the defined all-equal case are
used here instead.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SPAN_EPS = 1e-9
_BOUND_SLACK = 1e-6  # faiss (float32) and numpy can disagree in the last bits


def unit(v: np.ndarray) -> np.ndarray:
  """v / |v| as float32 along the last axis; zero vectors stay zero."""
  v = np.asarray(v, np.float32)
  n = np.linalg.norm(v, axis=-1, keepdims=True)
  return (v / np.where(n > 0, n, 1)).astype(np.float32)


class BucketCache:
  """One bucket's unit embeddings and counts in memory, so a query reads no blobs.

  Rows are in no particular order (a replaced memory takes its predecessor's row); `pos` maps
  memory id -> row. Arrays grow by doubling. The faiss indexes are built on first use and dropped
  when a row is overwritten (appends are added to them).
  """

  def __init__(self, dim: int, capacity: int = 16):
    self.dim, self.n = dim, 0
    self.ids = np.zeros(capacity, np.int64)
    self.q = np.zeros((capacity, dim), np.float32)        # [cap, d] unit
    self.c = np.zeros((capacity, dim), np.float32)        # [cap, d] unit, 0 without caption
    self.has_c = np.zeros(capacity, bool)
    self.correct = np.zeros(capacity, bool)
    self.success = np.zeros(capacity, np.int64)
    self.usage = np.zeros(capacity, np.int64)
    self.pos: dict[int, int] = {}
    self._faiss: dict[str, object] = {}

  @classmethod
  def from_rows(cls, dim: int, rows) -> "BucketCache":
    """rows: (id, q_blob, c_blob | None, outcome, success, usage) as read from SQLite."""
    rows = list(rows)
    cache = cls(dim, max(16, len(rows)))
    n = cache.n = len(rows)
    if n:
      cache.ids[:n] = [r[0] for r in rows]
      cache.q[:n] = unit(np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(n, dim))
      has_c = np.array([r[2] is not None for r in rows])
      if has_c.any():
        blobs = b"".join(r[2] for r in rows if r[2] is not None)
        cache.c[:n][has_c] = unit(np.frombuffer(blobs, np.float32).reshape(-1, dim))
      cache.has_c[:n] = has_c
      cache.correct[:n] = [r[3] == "correct" for r in rows]
      cache.success[:n] = [r[4] for r in rows]
      cache.usage[:n] = [r[5] for r in rows]
      cache.pos = {int(i): j for j, i in enumerate(cache.ids[:n])}
    return cache

  def _grow(self) -> None:
    cap = 2 * len(self.ids)
    for name in ("ids", "q", "c", "has_c", "correct", "success", "usage"):
      old = getattr(self, name)
      new = np.zeros((cap,) + old.shape[1:], old.dtype)
      new[:self.n] = old[:self.n]
      setattr(self, name, new)

  def _write(self, row, mem_id, q, c, correct, success, usage) -> None:
    self.ids[row], self.q[row], self.has_c[row] = mem_id, q, c is not None
    self.c[row] = c if c is not None else 0
    self.correct[row], self.success[row], self.usage[row] = correct, success, usage
    self.pos[mem_id] = row

  def append(self, mem_id, q, c, correct, success=1, usage=1) -> None:
    if self.n == len(self.ids):
      self._grow()
    self._write(self.n, mem_id, q, c, correct, success, usage)
    self.n += 1
    for kind, index in self._faiss.items():
      index.add(self._faiss_rows(kind, slice(self.n - 1, self.n)))

  def replace(self, old_id, mem_id, q, c, correct, success=1, usage=1) -> None:
    row = self.pos.pop(old_id)
    self._write(row, mem_id, q, c, correct, success, usage)
    self._faiss.clear()

  def set_counts(self, mem_id, success, usage) -> None:
    row = self.pos.get(mem_id)
    if row is not None:
      self.success[row], self.usage[row] = success, usage

  # ------------------------------------------------------------------------------ scoring

  def sims(self, q: np.ndarray, c: np.ndarray | None, beta: float, rows=slice(None)):
    """sim_i (float64) for the given rows (default all), query unit vectors q and c (or None)."""
    n = self.n
    cos_q = (self.q[:n][rows] @ q).astype(np.float64)
    if c is None:
      return cos_q
    cos_c = (self.c[:n][rows] @ c).astype(np.float64)
    return np.where(self.has_c[:n][rows], beta * cos_q + (1 - beta) * cos_c, cos_q)

  def win_rates(self, rows=slice(None)) -> np.ndarray:
    return self.success[:self.n][rows] / self.usage[:self.n][rows]

  # ------------------------------------------------------------------------------- faiss

  def _faiss_rows(self, kind: str, rows) -> np.ndarray:
    """Index vectors whose inner product with the query vector is sim_i exactly:
    'q': q_i (query q);  'qc': [q_i, c_i] with caption, [q_i / beta, 0] without
    (query [beta q, (1 - beta) c]), so captionless memories still score cos(q, q_i)."""
    q = self.q[:self.n][rows]
    if kind == "q":
      return np.ascontiguousarray(q)
    beta = float(kind[2:])
    has_c = self.has_c[:self.n][rows, None]
    return np.ascontiguousarray(np.concatenate(
        [np.where(has_c, q, q / beta), self.c[:self.n][rows]], axis=1), np.float32)

  def faiss_index(self, kind: str):
    if kind not in self._faiss:
      import faiss  # deferred: only large buckets need it

      index = faiss.IndexFlatIP(self.dim if kind == "q" else 2 * self.dim)
      index.add(self._faiss_rows(kind, slice(None)))
      self._faiss[kind] = index
    return self._faiss[kind]


@dataclasses.dataclass(frozen=True)
class Ranked:
  """Rows of the chosen memories (best first) with sim, sim~ and f for each."""
  rows: np.ndarray
  sim: np.ndarray
  sim_norm: np.ndarray
  score: np.ndarray


def _top(rows, f, ids, k) -> np.ndarray:
  """Positions (into rows) of the k best by f, ties to the smaller id; O(len) then O(k log k)."""
  if rows.size > k:
    keep = np.argpartition(-f, k - 1)[:k]
    cut = f[keep].min()
    sel = np.flatnonzero(f >= cut)
  else:
    sel = np.arange(rows.size)
  order = np.lexsort((ids[rows[sel]], -f[sel]))[:k]
  return sel[order]


def _pick(cache, rows, sims, smin, span, alpha, k) -> tuple[Ranked, Ranked]:
  norm = (sims - smin) / span if span > SPAN_EPS else np.ones_like(sims)
  f = alpha * norm + (1 - alpha) * cache.win_rates(rows)
  out = []
  for want in (True, False):
    mask = cache.correct[:cache.n][rows] == want
    sub = np.flatnonzero(mask)
    top = sub[_top(rows[sub], f[sub], cache.ids, k)]
    out.append(Ranked(rows[top], sims[top], norm[top], f[top]))
  return out[0], out[1]


def rank(cache: BucketCache, q: np.ndarray, c: np.ndarray | None, *, beta: float, alpha: float,
         k: int, use_faiss: bool = False) -> tuple[Ranked, Ranked]:
  """(top-k correct, top-k incorrect) of the bucket for unit query vectors q and c (or None)."""
  n = cache.n
  if use_faiss and n > 0 and (c is None or beta > 0):
    found = _rank_faiss(cache, q, c, beta=beta, alpha=alpha, k=k)
    if found is not None:
      return found
  rows = np.arange(n)
  sims = cache.sims(q, c, beta)
  if n == 0:
    return _pick(cache, rows, sims, 0.0, 0.0, alpha, k)
  smin = sims.min()
  return _pick(cache, rows, sims, smin, sims.max() - smin, alpha, k)


def _rank_faiss(cache, q, c, *, beta, alpha, k):
  """The same answer as the numpy path, reading only the faiss top-m rows.

  A memory outside the top m by sim has f <= alpha sim~_(m) + (1 - alpha) (w <= 1); once each
  class has its k best candidates above that bound, no outsider can enter. Otherwise m grows 4x.
  Scores are recomputed in numpy for the candidates, so they match the numpy path. Returns None
  (use numpy) when every sim is equal (f then ranks by w alone, which faiss cannot narrow) or
  when m would reach half the bucket (a full numpy pass is then cheaper than a deep faiss sort).
  """
  n, m = cache.n, max(4 * k, 64)
  if 2 * m >= n:
    return None
  index = cache.faiss_index("q" if c is None else f"qc{beta!r}")
  query = q if c is None else np.concatenate([beta * q, (1 - beta) * c])
  query = np.ascontiguousarray(query[None], np.float32)
  _, lowest = index.search(-query, 1)  # the least similar memory gives min sim
  smin = float(cache.sims(q, c, beta, lowest[0])[0])
  totals = {True: int(cache.correct[:n].sum()), False: int(n - cache.correct[:n].sum())}
  while True:
    dist, found = index.search(query, m)
    rows = found[0][found[0] >= 0]
    sims = cache.sims(q, c, beta, rows)
    lo = min(smin, float(sims.min()))
    span = float(sims.max()) - lo
    if span <= SPAN_EPS:
      return None
    f = alpha * (sims - lo) / span + (1 - alpha) * cache.win_rates(rows)
    bound = alpha * (float(dist[0, -1]) - lo) / span + (1 - alpha) + _BOUND_SLACK
    complete = True
    for want, total in totals.items():
      in_class = cache.correct[:n][rows] == want
      need = min(k, total)
      if in_class.sum() < total and (f[in_class] >= bound).sum() < need:
        complete = False
    if complete:
      return _pick(cache, rows, sims, lo, span, alpha, k)
    m *= 4
    if 2 * m >= n:
      return None
