"""What our small JSON-over-HTTP servers share (the search server, the chat server): quiet
logging unless the server is verbose, JSON replies that survive a client hanging up, request
bodies bounded by Content-Length, answer counts, and one worker thread that merges queued
requests into one model or encoder call."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import queue
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


class BodyError(ValueError):
  """The request body cannot be read: `status` is the HTTP status to answer with."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


class JsonHandler(BaseHTTPRequestHandler):
  """The handler of a `JsonServer`."""

  def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
    if self.server.verbose:
      super().log_message(format, *args)

  def _send(self, status: int, payload: dict) -> None:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    self.server.count(status)
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
      pass

  def _body(self, max_bytes: int) -> bytes:
    """The request body; BodyError (411, 400, 413) when Content-Length is missing, not an
    integer, or over `max_bytes`."""
    length = self.headers.get("Content-Length")
    if length is None:
      raise BodyError(411, "missing Content-Length header")
    try:
      n = int(length)
    except ValueError:
      raise BodyError(400, f"Content-Length {length!r} is not an integer") from None
    if n < 0 or n > max_bytes:
      raise BodyError(413, f"body of {n} bytes; at most {max_bytes}")
    return self.rfile.read(n)


class JsonServer(ThreadingHTTPServer):
  """A threaded server that counts its answers and closes its `batcher` (set by the subclass
  after binding) when it closes."""

  daemon_threads = True
  request_queue_size = 128  # listen backlog; the default 5 refuses bursts of clients
  url_path = ""  # `url` is http://host:port + this
  label = "server"  # in logged errors

  def __init__(self, address, handler, verbose: bool = False):
    super().__init__(address, handler)
    self.verbose = verbose
    self.batcher = None
    self.requests = self.errors = 0  # answered requests, and how many of them were 4xx/5xx
    self._count_lock = threading.Lock()

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{host}:{port}{self.url_path}"

  def count(self, status: int) -> None:
    with self._count_lock:
      self.requests += 1
      self.errors += status >= 400

  def handle_error(self, request, client_address):
    log.exception("%s: error while handling a request from %s", self.label, client_address)

  def server_close(self):
    super().server_close()
    if self.batcher is not None:
      self.batcher.close()


class QueueWorker:
  """One thread that serves queued requests in rounds, so that concurrent HTTP handlers share
  one model or encoder call: a round is the first waiting item plus whatever else is already
  queued (no added wait) while `_room(items)` says so. Items are tuples ending in a Future."""

  thread_name = "batcher"

  def __init__(self):
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
    self._thread.start()

  def _submit(self, *payload):
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._queue.put((*payload, future))
    return future.result()

  def close(self) -> None:
    self._queue.put(None)
    self._thread.join(timeout=10)

  def _room(self, items: list) -> bool:
    return True

  def _round(self, items: list) -> None:
    raise NotImplementedError

  @staticmethod
  def _fail(items: list, error: Exception) -> None:
    for item in items:
      item[-1].set_exception(error)

  def _loop(self) -> None:
    while True:
      item = self._queue.get()
      if item is None:
        return
      items, stop = [item], False
      while self._room(items):
        try:
          nxt = self._queue.get_nowait()
        except queue.Empty:
          break
        if nxt is None:
          stop = True
          break
        items.append(nxt)
      try:
        self._round(items)
      except Exception:  # noqa: BLE001 -- a dead worker would hang every later request
        log.exception("%s: unexpected error", self.thread_name)
      if stop:
        return


class RemoteError(RuntimeError):
  """A remote call that gave no result: the HTTP `status` if any, and the attempts it took."""

  def __init__(self, message: str, status: int | None = None, attempts: int = 0):
    super().__init__(message)
    self.status, self.attempts = status, attempts


def backoff_delay(attempt: int, base_s: float, max_s: float, jitter: float) -> float:
  """Seconds before retry `attempt` (1, 2, ...): base_s * 2^(attempt-1), capped, +-jitter."""
  delay = min(max_s, base_s * 2 ** (attempt - 1))
  return delay * random.uniform(1 - jitter, 1 + jitter) if jitter else delay


def with_retries(call, *, retries: int, retryable: type, delay, sleep, on_retry=None):
  """call() up to retries + 1 times, sleeping delay(attempt) before each retry; only
  `retryable` RemoteErrors are retried. Any RemoteError leaves with `.attempts` set; after the
  last attempt the last retryable one is raised."""
  last = None
  for attempt in range(retries + 1):
    if attempt:
      if on_retry is not None:
        on_retry()
      sleep(delay(attempt))
    try:
      return call()
    except retryable as e:
      e.attempts, last = attempt + 1, e
    except RemoteError as e:  # a 4xx or a malformed reply: sending it again cannot help
      e.attempts = attempt + 1
      raise
  raise last
