"""The Search-R1 retrieval protocol over HTTP, standard library only.

POST /retrieve  {"queries": [str, ...], "topk": int, "return_scores": bool}
  -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query]}
     or, with return_scores false, {"result": [[{"id", "contents"}, ...] per query]}
GET /health     -> {"status": "ok", "count": ..., "model": ..., "dim": ...}

Matches `QueryRequest` and `retrieve_endpoint` of Search-R1's FastAPI server
(PeterGriffinJin/Search-R1 search_r1/search/retrieval_server.py, read in the fork
MaoXiaoYuZ/Search-R1; the request/response example is upstream's
search_r1/search/retrieval_request.py; the APEx authors run that server, J-Ding519/APEx README.md
"Offline Text Search"): `topk` missing or null means the server's default; `return_scores`
defaults to false. Where FastAPI/pydantic would coerce ("3" for topk) or upstream would read 0 as
its default we answer 400 naming the field and value instead (`topk` >= 1). A malformed request never takes the
server down: 400 (or 404/411/413) with `{"error": ..., "field": ...}`, 500 on an internal error.

Concurrent requests are coalesced: one worker thread embeds and searches everything queued at
that moment in one encoder call and one faiss search (no added wait when a request is alone).
Each request is validated on its own before it is merged (lone surrogates, query length, JSON
depth and number size: 400 naming the field), and when a merged call still fails each request is
retried alone, so a bad request never fails the requests batched with it. `SearchLimits` holds
every bound (body size 413, requests being handled 503, read deadline and the budget of
connections still sending 408, queue 503, queries per request and per encoder call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Sequence

from morse_jax.serving.http import (BodyError, HttpLimits, JsonHandler, JsonServer, QueueWorker,
                                    Unavailable, check_text, describe, load_json)

from apex_jax.tools.index import Retriever

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SearchLimits(HttpLimits):
  """Every bound of the search server (each a `launchers.serve_search` flag)."""

  max_queries: int = 256  # queries in one request
  max_query_chars: int = 2048  # characters in one query
  max_topk: int = 100
  max_batch: int = 256  # queries merged into one encoder call


MAX_BODY_BYTES = SearchLimits.max_body_bytes


class RequestError(ValueError):
  """A malformed request: answered with HTTP `status` and a JSON error naming `field`."""

  def __init__(self, field: str, message: str, status: int = 400):
    super().__init__(message)
    self.field, self.status = field, status


_describe = describe


def parse_request(body: bytes, default_topk: int, max_topk: int | None = None,
                  max_queries: int | None = None,
                  limits: SearchLimits | None = None) -> tuple[list[str], int, bool]:
  """A `/retrieve` body -> (queries, topk, return_scores), or RequestError."""
  limits = limits or SearchLimits()
  max_topk = max_topk or limits.max_topk
  max_queries = max_queries or limits.max_queries
  try:
    req = load_json(body, limits.max_json_depth, limits.max_number_digits)
  except ValueError as e:
    raise RequestError("body", str(e)) from None
  if not isinstance(req, dict):
    raise RequestError("body", f"expected a JSON object, got {_describe(req)}")
  if "queries" not in req:
    raise RequestError("queries", "missing field 'queries' (a list of strings)")
  queries = req["queries"]
  if not isinstance(queries, list):
    raise RequestError("queries", f"field 'queries' must be a list of strings, got "
                                  f"{_describe(queries)}")
  if len(queries) > max_queries:
    raise RequestError("queries", f"{len(queries)} queries; at most {max_queries} per request")
  for i, q in enumerate(queries):
    if not isinstance(q, str):
      raise RequestError("queries", f"queries[{i}] must be a string, got {_describe(q)}")
    if len(q) > limits.max_query_chars:
      raise RequestError("queries", f"queries[{i}] has {len(q)} characters; at most "
                                    f"{limits.max_query_chars}")
    bad = check_text(q, f"queries[{i}]")
    if bad:
      raise RequestError("queries", f"{bad}: {_describe(q)}")
  topk = req.get("topk")
  if topk is None:
    topk = default_topk
  elif not isinstance(topk, int) or isinstance(topk, bool):
    raise RequestError("topk", f"field 'topk' must be an integer, got {_describe(topk)}")
  elif not 1 <= topk <= max_topk:
    raise RequestError("topk", f"field 'topk' must be in [1, {max_topk}], got {topk}")
  scores = req.get("return_scores")
  if scores is None:
    scores = False
  elif not isinstance(scores, bool):
    raise RequestError("return_scores",
                       f"field 'return_scores' must be true or false, got {_describe(scores)}")
  return queries, topk, scores


class Batcher(QueueWorker):
  """Runs `retriever.retrieve` on one thread, merging whatever requests are queued together."""

  thread_name = "search-batcher"

  def __init__(self, retriever: Retriever, max_batch: int = 256, max_queue: int = 256):
    self.retriever, self.max_batch = retriever, max_batch
    self.calls = self.queries = 0  # retrieve calls, queries embedded (calls < requests: batching)
    self.isolated = 0  # merged calls that failed and were retried one request at a time
    super().__init__(max_queue)

  def submit(self, queries: Sequence[str], topk: int):
    return self._submit(list(queries), topk)

  def _room(self, items) -> bool:
    return sum(len(qs) for qs, _, _ in items) < self.max_batch

  def _round(self, items) -> None:
    if not self._run(items) and len(items) > 1:
      self.isolated += 1  # one bad request must not fail the others: each alone
      for item in items:
        self._run([item])

  def _run(self, items) -> bool:
    """Answers `items` from one retrieve call; False (nothing answered) when it fails and
    there are several items, else the error goes to the one item."""
    queries = [q for qs, _, _ in items for q in qs]
    try:
      results = self.retriever.retrieve(queries, max(k for _, k, _ in items))
      self.calls, self.queries = self.calls + 1, self.queries + len(queries)
    except Exception as e:  # noqa: BLE001 -- a lone request gets it as a 500
      if len(items) > 1:
        return False
      self._fail(items, e)
      return True
    start = 0
    for qs, k, future in items:
      future.set_result([r[:k] for r in results[start:start + len(qs)]])
      start += len(qs)
    return True


class SearchServer(JsonServer):
  url_path = "/retrieve"
  label = "search server"

  def __init__(self, address, retriever: Retriever, topk: int = 3, max_topk: int | None = None,
               max_queries: int | None = None, verbose: bool = False,
               limits: SearchLimits | None = None):
    limits = limits or SearchLimits()
    super().__init__(address, _Handler, verbose, limits)
    self.retriever, self.topk = retriever, topk
    self.max_topk = max_topk or limits.max_topk
    self.max_queries = max_queries or limits.max_queries
    self.batcher = Batcher(retriever, limits.max_batch, limits.max_queue)


class _Handler(JsonHandler):
  server: SearchServer
  server_version = "apex-search/1"

  def _error(self, e: RequestError) -> None:
    self._send(e.status, {"error": str(e), "field": e.field})

  def do_GET(self):
    if self.path.split("?")[0] == "/health":
      meta = self.server.retriever.index.meta
      self._send(200, {"status": "ok", "count": meta["count"], "model": meta["model"],
                       "dim": meta["dim"], "index_type": meta["index_type"]})
    else:
      self._error(RequestError("path", f"no such endpoint: GET {self.path}", 404))

  def do_POST(self):
    if self.path.split("?")[0] != "/retrieve":
      return self._error(RequestError("path", f"no such endpoint: POST {self.path}", 404))
    try:
      body = self._read_body()
      queries, topk, with_scores = parse_request(body, self.server.topk, self.server.max_topk,
                                                 self.server.max_queries, self.server.limits)
    except RequestError as e:
      return self._error(e)
    try:
      results = self.server.batcher.submit(queries, topk) if queries else []
    except Unavailable as e:
      return self._send(503, {"error": str(e)})
    except Exception as e:  # noqa: BLE001 -- the server stays up; the client sees a 500
      log.error("search server: retrieval failed: %s: %.200s", type(e).__name__, e)
      return self._send(500, {"error": f"internal error: {type(e).__name__}: {str(e)[:200]}"})
    if with_scores:
      result = [[{"document": p.document(), "score": p.score} for p in r] for r in results]
    else:
      result = [[p.document() for p in r] for r in results]
    self._send(200, {"result": result})

  def _read_body(self) -> bytes:
    try:
      return self._body(self.server.limits.max_body_bytes)
    except BodyError as e:
      raise RequestError("Content-Length", str(e), e.status) from None


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                topk: int = 3, **kwargs) -> SearchServer:
  """A bound server (port 0: a free one; see `.url`); call `serve_forever` or use `running`."""
  if topk < 1:
    raise ValueError(f"topk must be >= 1, got {topk}")
  return SearchServer((host, port), retriever, topk=topk, **kwargs)


@contextlib.contextmanager
def running(server: SearchServer):
  """Serves on a background thread for the duration of the block, then shuts down."""
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                            name="search-server", daemon=True)
  thread.start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
