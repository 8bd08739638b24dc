"""Retrieval latency of the APEx tools: faiss search at 100k passages, the `/retrieve` HTTP server
end to end, and MemoryBank.retrieve at 10k and 100k memories.

  python -m benchmarks.memory [--out FILE] [--quick] [--queries N] [--cases faiss,http,memory]

1. faiss (flat = exact inner product, HNSW M=32 efSearch=64) over 100k passages. To keep the run
   short the index holds RANDOM UNIT VECTORS of dim 384 (MiniLM's), not embedded text; a query is
   a noisy copy of one stored vector (cosine ~0.7 to it), so there is a right answer and the
   HNSW recall means something. Latency per query at batch 1 (p50/p99) and throughput at batch 32.
   faiss search time depends on n and dim, not on where the vectors came from, but HNSW recall on
   random vectors is a pessimistic guess for real embeddings (which cluster).
2. HTTP `/retrieve` end to end: a 10k-passage index embedded with the real all-MiniLM-L6-v2
   (synthetic passages of --passage_words words; short by default so that the build fits on a
   small shared CPU: query latency does not depend on it), served on loopback by
   apex_jax.tools.server in this process, queried by SearchClient one query per request; the
   time includes query embedding, faiss, JSON and HTTP. Also the query encoder alone, and
   throughput with 8 client threads (the server merges queued requests into one encoder call).
3. memory_retrieval(n): MemoryBank.retrieve p50/p99 with n memories in one bucket
   (location / text-only), added with add_many and a fake fast embedder (random unit vectors).

Every timing is reported as wall clock and as process CPU time per call (`cpu_*`): on a machine
shared with other jobs the wall time includes waiting for a core. faiss and torch run --threads
threads (1 by default).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.common import threads_seconds, write_report  # noqa: E402

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_QUICK = flags.DEFINE_bool("quick", False, "Small sizes (10k / 1k / 10k) for a smoke run.")
_QUERIES = flags.DEFINE_integer("queries", 500, "Timed single queries per case.")
_THREADS = flags.DEFINE_integer("threads", 1, "faiss OpenMP and torch threads. 1 by default: on "
                                "a shared machine, two threads where one core is busy make faiss "
                                "batch-1 search ~50x slower (OpenMP barriers), not faster.")
_WORDS = flags.DEFINE_integer("passage_words", 24, "Words per synthetic passage of the HTTP case "
                              "(wiki-18 chunks have 100; only the index build time depends on it).")
_CASES = flags.DEFINE_list("cases", ["faiss", "http", "memory"], "Which parts to run.")
_INDEX_CACHE = flags.DEFINE_string("index_cache", None, "Folder to keep the HTTP case's MiniLM "
                                   "index in and reuse on the next run (default: a temp folder).")

DIM, TOPK, BATCH = 384, 3, 32


def percentiles(seconds, cpu_seconds=None) -> dict:
  """Wall-clock p50/p99 (ms); with `cpu_seconds`, the process CPU time per call too, which a busy
  shared machine inflates much less than wall time (it counts every thread of the process)."""
  ms = np.asarray(seconds) * 1e3
  out = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
         "mean_ms": float(ms.mean()), "n": int(ms.size)}
  if cpu_seconds is not None:
    cpu = np.asarray(cpu_seconds) * 1e3
    out.update(cpu_p50_ms=float(np.percentile(cpu, 50)), cpu_p99_ms=float(np.percentile(cpu, 99)))
  return out


def timed(fn, *args) -> tuple[float, float]:
  """(wall seconds, process CPU seconds) of fn(*args)."""
  wall, cpu = time.perf_counter(), time.process_time()
  fn(*args)
  return time.perf_counter() - wall, time.process_time() - cpu


def unit_rows(rng, n, dim=DIM) -> np.ndarray:
  x = rng.standard_normal((n, dim), dtype=np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


# ---- 1. faiss at 100k -------------------------------------------------------------------------

def faiss_search(n: int, queries: int, seed: int = 0) -> list[dict]:
  from apex_jax.tools.index import make_faiss_index

  rng = np.random.default_rng(seed)
  db = unit_rows(rng, n)
  planted = rng.integers(0, n, queries + BATCH * 50)
  noise = unit_rows(rng, len(planted))
  q = 0.7 * db[planted] + 0.714 * noise  # cos(q, planted row) ~ 0.7; |q| ~ 1
  q /= np.linalg.norm(q, axis=1, keepdims=True)
  out, reference = [], None
  for kind in ("flat", "hnsw"):
    index = make_faiss_index(DIM, kind, hnsw_m=32, ef_construction=80, ef_search=64)
    start = time.perf_counter()
    index.add(db)
    build_s = time.perf_counter() - start
    index.search(q[:8], TOPK)  # warm-up
    single = [timed(index.search, q[i:i + 1], TOPK) for i in range(queries)]
    batches = q[queries:].reshape(-1, BATCH, DIM)
    batched_s, batched_cpu_s = timed(lambda: [index.search(b, TOPK) for b in batches])
    _, rows = index.search(q[:queries], TOPK)
    if reference is None:
      reference = rows
    r = {"case": f"faiss_{kind}", "n": n, "dim": DIM, "topk": TOPK, "build_s": build_s,
         "batch1": percentiles(*zip(*single)),
         "batch32_queries_per_s": batches.shape[0] * BATCH / batched_s,
         "batch32_queries_per_cpu_s": batches.shape[0] * BATCH / batched_cpu_s,
         "recall_at_1_planted": float(np.mean(rows[:, 0] == planted[:queries])),
         f"overlap_at_{TOPK}_with_flat": float(np.mean(
             [len(set(a) & set(b)) / TOPK for a, b in zip(rows, reference)]))}
    out.append(r)
    print(f"faiss {kind:<4} n={n}: build {build_s:6.2f} s  batch-1 p50 "
          f"{r['batch1']['p50_ms']:7.3f} ms  p99 {r['batch1']['p99_ms']:7.3f} ms  (cpu p50 "
          f"{r['batch1']['cpu_p50_ms']:.3f} ms)  "
          f"batch-32 {r['batch32_queries_per_s']:7.0f} q/s ({r['batch32_queries_per_cpu_s']:.0f} "
          f"per cpu-s)  recall@1 "
          f"{r['recall_at_1_planted']:.3f}  overlap@{TOPK} {r[f'overlap_at_{TOPK}_with_flat']:.3f}",
          flush=True)
  return out


# ---- 2. HTTP /retrieve with real MiniLM -------------------------------------------------------

WORDS = ("river city king war music film team school science church island player album "
         "university company government station village season party bridge museum novel "
         "railway mountain festival battle army law court bank temple emperor language "
         "painting theatre airport league election province dynasty species bird forest "
         "coast harbour castle ship engine poem opera hospital market tower library desert "
         "valley lake empire treaty trade mine coal gold silver iron steel bronze glass paper "
         "cotton wool rice wheat tea coffee sugar salt horse cattle sheep wolf bear lion eagle "
         "whale comet planet moon star telescope physics chemistry medicine vaccine surgery "
         "computer software network satellite rocket radio television newspaper magazine "
         "author painter composer singer actor director architect bishop general senator "
         "mayor governor president minister queen prince duke monk saint pilgrim").split()


def synthetic_corpus(path: str, n: int, words: int, seed: int = 0) -> None:
  import json

  rng = np.random.default_rng(seed)
  with open(path, "w") as f:
    for i in range(n):
      title = " ".join(rng.choice(WORDS, 2)).title()
      text = " ".join(rng.choice(WORDS, words))
      f.write(json.dumps({"id": str(i), "contents": f'"{title} {i}"\n{text}'}) + "\n")


def _minilm_index(n: int, words: int, folder: str, encoder) -> tuple[float, bool]:
  """Builds (or reuses) the n-passage index in `folder`; -> (build seconds, reused)."""
  import json

  from apex_jax.tools import index

  meta_path = os.path.join(folder, "index", "meta.json")
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    if meta["count"] == n and meta.get("words") == words:
      return meta["embed_seconds"], True
  os.makedirs(folder, exist_ok=True)
  corpus = os.path.join(folder, "corpus.jsonl")
  synthetic_corpus(corpus, n, words)
  meta = index.build_index(corpus, os.path.join(folder, "index"), encoder, batch_size=256,
                           overwrite=True, log=lambda line: print("  " + line, flush=True))
  with open(meta_path, "w") as f:
    json.dump({**meta, "words": words}, f, indent=2)
  return meta["embed_seconds"], False


def http_retrieve(n: int, queries: int, words: int, cache: str | None, threads: int,
                  seed: int = 0) -> dict:
  from apex_jax.tools import SearchClient, index, server

  rng = np.random.default_rng(seed + 1)
  texts = [" ".join(rng.choice(WORDS, 8)) for _ in range(queries + 8 * 25 + 5)]
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    encoder = index.SentenceEncoder(batch_size=128)
    load_s = time.perf_counter() - start
    folder = cache or tmp
    build_s, reused = _minilm_index(n, words, folder, encoder)
    search_index = index.SearchIndex(os.path.join(folder, "index"), omp_threads=threads)
    retriever = index.Retriever(search_index, encoder)
    encode = [timed(encoder.encode, [t]) for t in texts[:min(queries, 100)]]
    with server.running(server.make_server(retriever, "127.0.0.1", 0, topk=TOPK)) as srv:
      client = SearchClient(srv.url, topk=TOPK, timeout_s=120, max_concurrency=8)
      for t in texts[:5]:  # warm-up (first request, thread pools)
        client.search([t])
      single = [timed(client.search, [t]) for t in texts[5:5 + queries]]
      rest = texts[5 + queries:]
      calls_before = srv.batcher.calls

      def worker(i):
        for t in rest[i::8]:
          client.search([t])

      concurrent_s = threads_seconds([threading.Thread(target=worker, args=(i,))
                                      for i in range(8)])
      merged_calls = srv.batcher.calls - calls_before
  r = {"case": "http_retrieve_minilm", "n": n, "topk": TOPK, "passage_words": words,
       "model_load_s": load_s, "index_build_s": build_s, "index_reused": reused,
       "passages_per_s": n / build_s, "encode_one_query": percentiles(*zip(*encode)),
       "http_batch1": percentiles(*zip(*single)),
       "http_8_threads_requests_per_s": len(rest) / concurrent_s,
       "http_8_threads_encoder_calls": merged_calls, "http_8_threads_requests": len(rest)}
  h, e = r["http_batch1"], r["encode_one_query"]
  print(f"http /retrieve n={n} (MiniLM): p50 {h['p50_ms']:7.2f} ms  p99 {h['p99_ms']:7.2f} ms  "
        f"(cpu p50 {h['cpu_p50_ms']:.2f} ms; query encoding alone p50 {e['p50_ms']:.2f} ms, cpu "
        f"{e['cpu_p50_ms']:.2f} ms)  8 threads {r['http_8_threads_requests_per_s']:.0f} req/s in "
        f"{merged_calls} encoder calls for {len(rest)} requests; index built at "
        f"{r['passages_per_s']:.0f} passages/s{' (reused)' if reused else ''}", flush=True)
  return r


# ---- 3. memory_retrieval: apex_jax.memory.MemoryBank ------------------------------------------
# Hook for the memory package (built separately): MemoryBank(path, embedder), add_many(...),
# retrieve(question, caption=None, category=..., modality=..., k=2). Skipped with a message when
# the package is not importable or its API differs.

class FakeEmbedder:
  """texts -> fresh random unit vectors [n, dim]: embedding cost ~0, so only retrieval is timed."""

  def __init__(self, dim: int = DIM, seed: int = 0):
    self.dim, self.rng, self.lock = dim, np.random.default_rng(seed), threading.Lock()

  def __call__(self, texts):
    with self.lock:
      return unit_rows(self.rng, len(texts), self.dim)


def memory_retrieval(n: int, queries: int = 200, seed: int = 0) -> dict:
  case = {"case": "memory_retrieve", "n": n, "bucket": "location/text-only", "k": 2}
  try:
    from apex_jax.memory import MemoryBank
  except ImportError as e:
    print(f"memory_retrieval n={n}: SKIPPED, apex_jax.memory not importable ({e})", flush=True)
    return {**case, "skipped": f"apex_jax.memory not importable: {e}"}
  try:
    with tempfile.TemporaryDirectory() as tmp:
      bank = MemoryBank(os.path.join(tmp, "memory.db"), FakeEmbedder(DIM, seed))
      items = [dict(question=f"Where is landmark number {i} located?",
                    workflow_summary=f"search the landmark {i}; read the first result; answer",
                    outcome=i % 3 != 0, category="location", modality="text-only")
               for i in range(n)]
      start = time.perf_counter()
      for lo in range(0, n, 10_000):  # random vectors never collide: skip the O(n^2) dedup
        bank.add_many(items[lo:lo + 10_000], dedup=False)
      add_s = time.perf_counter() - start
      ask = dict(caption=None, category="location", modality="text-only", k=2)
      start = time.perf_counter()
      found = bank.retrieve("Where is the old lighthouse?", **ask)
      first_s = time.perf_counter() - start
      if len(found.correct) != 2 or len(found.incorrect) != 2:
        raise AssertionError(f"expected 2 correct + 2 incorrect memories, got {found}")
      times = [timed(lambda i=i: bank.retrieve(f"Where is place {i}?", **ask))
               for i in range(queries)]
      bank.close()
  except Exception as e:  # noqa: BLE001 -- the memory API may still change under us
    print(f"memory_retrieval n={n}: FAILED, {type(e).__name__}: {e}", flush=True)
    return {**case, "skipped": f"{type(e).__name__}: {e}"}
  r = {**case, "add_many_s": add_s, "first_retrieve_ms": first_s * 1e3,
       "retrieve": percentiles(*zip(*times))}
  print(f"memory retrieve n={n}: p50 {r['retrieve']['p50_ms']:7.3f} ms  p99 "
        f"{r['retrieve']['p99_ms']:7.3f} ms  (cpu p50 {r['retrieve']['cpu_p50_ms']:.3f} ms; "
        f"add_many {add_s:.1f} s, first retrieve "
        f"{r['first_retrieve_ms']:.1f} ms)", flush=True)
  return r


def main(argv):
  del argv
  threads = _THREADS.value
  # Before faiss and torch load their OpenMP runtimes: the setting then holds in every thread
  # (the server's worker too), not only in the one that calls omp_set_num_threads.
  os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
  import faiss
  import torch

  faiss.omp_set_num_threads(threads)
  torch.set_num_threads(threads)
  quick, cases = _QUICK.value, set(_CASES.value)
  if cases - {"faiss", "http", "memory"}:
    raise app.UsageError(f"--cases: unknown {sorted(cases - {'faiss', 'http', 'memory'})}")
  queries = 50 if quick else _QUERIES.value
  print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads, torch "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}", flush=True)
  results = []
  if "faiss" in cases:
    results += faiss_search(10_000 if quick else 100_000, queries)
  if "http" in cases:
    results.append(http_retrieve(1_000 if quick else 10_000, min(queries, 200), _WORDS.value,
                                 _INDEX_CACHE.value, threads))
  if "memory" in cases:
    for n in ((10_000,) if quick else (10_000, 100_000)):
      results.append(memory_retrieval(n, min(queries, 200)))
  write_report("memory", _OUT.value, faiss=faiss.__version__, threads=threads,
               load_average_at_end=os.getloadavg()[0], quick=quick,
               note="faiss cases: random unit vectors, not embedded text (see docstring); "
                    "cpu_* = process CPU time per call, wall times include waiting for a "
                    "shared CPU", results=results)


if __name__ == "__main__":
  app.run(main)
