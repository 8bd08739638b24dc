"""Serve an index folder over HTTP with the Search-R1 `/retrieve` protocol.

  python -m launchers.serve_search --index=/data/wiki_index [--host=127.0.0.1 --port=8000 --topk=3]
  curl -s localhost:8000/retrieve -d '{"queries": ["who wrote hamlet"], "topk": 3,
                                       "return_scores": true}'

The query encoder is the model named in the index's meta.json unless --model overrides it (it must
have the same dimension). GET /health reports the index. Stop with Ctrl-C or SIGTERM (graceful:
queued requests are answered, exit 0). Every `SearchLimits` field is a flag (--max_body_bytes,
--max_connections, --read_timeout_s, --max_incomplete, --max_incomplete_per_address, --max_queue,
--max_queries, --max_query_chars, ...).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

_INDEX = flags.DEFINE_string("index", None, "Index folder from launchers.build_index.",
                             required=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: all interfaces).")
_PORT = flags.DEFINE_integer("port", 8000, "Port (0: any free port).")
_TOPK = flags.DEFINE_integer("topk", 3, "Passages per query when a request gives no topk.")
_MAX_TOPK = flags.DEFINE_integer("max_topk", 100, "Largest topk a request may ask for.")
_MODEL = flags.DEFINE_string("model", None, "Query encoder folder (default: meta.json's).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Log every request.")
from morse_jax.serving.http import define_limit_flags  # noqa: E402
from apex_jax.tools.server import SearchLimits  # noqa: E402

_LIMITS = define_limit_flags(SearchLimits, skip=("max_topk",))
_THREADS = flags.DEFINE_integer("threads", 0, "faiss (OpenMP) and torch threads; 0: their "
                                "defaults (one per core). Use 1 on a machine shared with other "
                                "jobs.")


def main(argv):
  del argv
  from apex_jax.tools import index, server
  from morse_jax.serving.http import serve_until_stopped
  from morse_jax.experiments.pipeline import banner

  if _THREADS.value:
    import torch

    torch.set_num_threads(_THREADS.value)
  banner("load index")
  search_index = index.SearchIndex(_INDEX.value, omp_threads=_THREADS.value or None)
  meta = search_index.meta
  print(f"{search_index.folder}: {meta['count']} passages, {meta['index_type']}, dim {meta['dim']}")
  encoder = index.SentenceEncoder(_MODEL.value or meta["model"])
  retriever = index.Retriever(search_index, encoder)
  srv = server.make_server(retriever, _HOST.value, _PORT.value, topk=_TOPK.value,
                           verbose=_VERBOSE.value, limits=_LIMITS(max_topk=_MAX_TOPK.value))
  banner(f"serving {srv.url}")
  try:
    serve_until_stopped(srv)
  finally:
    print(f"served {srv.requests} requests ({srv.errors} errors, {srv.refused} refused, "
          f"{srv.timeouts} timed out)", flush=True)


if __name__ == "__main__":
  app.run(main)
