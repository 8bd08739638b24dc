"""What our small JSON-over-HTTP servers share (the search server, the chat server): quiet
logging unless the server is verbose (one line per error, never a traceback for a client's
fault), JSON replies that survive a client hanging up, hostile-input guards (bounded bodies,
JSON depth and number size, lone surrogates), requests read whole before they get a thread
(`intake.Intake`: a budget for connections still sending, the longest-waiting cut first, and a
deadline for each request), a cap on the requests being handled (503 beyond it), handlers that
notice a client hanging up while they wait (`JsonHandler.client_gone`), a bounded work queue (503
when full; items whose client left hold no place), graceful shutdown (stop accepting, finish
what is queued, join the worker), and one worker thread that merges queued requests into one
model or encoder call."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import io
import json
import logging
import queue
import random
import select
import selectors
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import ThreadingMixIn

from morse_jax.serving.intake import Intake

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HttpLimits:
  """What every server bounds. Each field is a launcher flag of the same name."""

  max_body_bytes: int = 1 << 20  # larger bodies: 413 before reading them
  max_connections: int = 64  # requests being handled (each a thread); more: 503
  read_timeout_s: float = 10.0  # to send a request's line, headers and body (slowloris: 408)
  # connections still sending their request (no thread yet): over a bound, the address holding
  # the most loses its longest-stalled partial request (else its longest-waiting connection): 408
  max_incomplete: int = 256
  max_incomplete_per_address: int = 64
  max_incomplete_bytes: int = 64 << 20  # buffered by connections still sending
  max_header_bytes: int = 65536  # request line + headers; more: 431
  max_queue: int = 256  # requests waiting for the worker; more: 503
  max_json_depth: int = 16  # nesting of the request JSON
  max_number_digits: int = 64  # digits of any JSON number
  shutdown_grace_s: float = 30.0  # on SIGTERM: time for queued work before it is answered 503

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if isinstance(f.default, bool):  # a switch, not a bound
        if not isinstance(value, bool):
          raise ValueError(f"{type(self).__name__}.{f.name} must be a bool, got {value!r}")
        continue
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{type(self).__name__}.{f.name} must be a positive number, got "
                         f"{value!r}")


class BodyError(ValueError):
  """The request body cannot be read: `status` is the HTTP status to answer with."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


class Unavailable(RuntimeError):
  """Answered 503: the queue is full, or the server is shutting down."""


HANGUP_POLL_S = 0.05  # how often a handler waiting for its answer looks at its client's socket
MAX_DRAINED_BYTES = 64 << 10  # bytes after the request read and dropped while looking for its end


def settle(future: concurrent.futures.Future, result=None,
           error: BaseException | None = None) -> None:
  """Sets `future`'s result (or `error`) unless it is done already: cancelled, when the client
  that waits for it hung up meanwhile."""
  try:
    if error is None:
      future.set_result(result)
    else:
      future.set_exception(error)
  except concurrent.futures.InvalidStateError:
    pass


def describe(value) -> str:
  """A value for an error message: its JSON type and the start of its text."""
  if isinstance(value, float) and value != value:
    text = "NaN"
  else:
    try:
      text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
      text = repr(value)
  return f"{type(value).__name__} {text[:60]}"


def check_text(text: str, where: str) -> str | None:
  """None when `text` is valid Unicode (encodable as UTF-8), else why not, naming `where`."""
  try:
    text.encode("utf-8")
    return None
  except UnicodeEncodeError as e:
    return (f"{where} is not valid Unicode: lone surrogate U+{ord(text[e.start]):04X} at "
            f"index {e.start}")


def load_json(body: bytes, max_depth: int, max_digits: int):
  """The parsed body, or ValueError whose message says what is wrong (UTF-8, syntax, a number
  over `max_digits` digits, nesting over `max_depth`). NaN and Infinity parse: the fields that
  take numbers refuse them by name."""

  def integer(text):
    if len(text) > max_digits:
      raise ValueError(f"a number of {len(text)} digits; at most {max_digits}")
    return int(text)

  def real(text):
    if len(text) > max_digits:
      raise ValueError(f"a number of {len(text)} characters; at most {max_digits}")
    return float(text)

  try:
    text = body.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"body is not UTF-8 (byte {e.start})") from None
  try:
    value = json.loads(text, parse_int=integer, parse_float=real)
  except json.JSONDecodeError as e:
    raise ValueError(f"invalid JSON: {e.msg} (line {e.lineno} column {e.colno})") from None
  except RecursionError:  # the C scanner's own guard (about 1000 levels)
    raise ValueError(f"JSON nested too deep; at most {max_depth} levels") from None
  depth = json_depth(value, max_depth)
  if depth > max_depth:
    raise ValueError(f"JSON nested more than {max_depth} levels")
  return value


def json_depth(value, limit: int) -> int:
  """The nesting depth of a parsed JSON value (a scalar: 0), counted up to limit + 1."""
  deepest, stack = 0, [(value, 0)]
  while stack:
    v, d = stack.pop()
    if isinstance(v, (list, dict)):
      d += 1
      if d > limit:
        return d
      deepest = max(deepest, d)
      stack.extend((c, d) for c in (v.values() if isinstance(v, dict) else v))
  return deepest


class JsonHandler(BaseHTTPRequestHandler):
  """The handler of a `JsonServer`: one request per connection, already read whole by the
  server's intake (`rfile` holds its bytes); writing the answer has `limits.read_timeout_s` per
  socket operation."""

  server: "JsonServer"

  def setup(self):
    self.timeout = self.server.limits.read_timeout_s  # StreamRequestHandler applies it
    self._gone, self._drained = False, 0
    super().setup()
    data = self.server.take_request_bytes(self.request)
    if data is not None:
      self.rfile.close()
      self.rfile = io.BytesIO(data)

  def handle(self):
    self.handle_one_request()  # HTTP/1.0: the connection closes after one answer

  def finish(self):
    try:
      super().finish()
    except OSError:  # the client is gone (or we cut it off): nothing left to flush
      pass

  def client_gone(self) -> bool:
    """True once the client has closed or reset its connection (the socket reads as ended or
    failed); never blocks. The request was read whole by the intake, so nothing else reads this
    socket: bytes the client sent after it (a pipelined request, never answered: one request
    per connection) are read and dropped, so that an end behind them is still seen (a peek
    could not see past them), up to MAX_DRAINED_BYTES; past that the client counts as there.
    A client that half-closes (shuts down its sending side, then waits for the answer) reads
    the same as one that closed: it counts as gone."""
    poller = select.poll()  # not select.select: a descriptor may be >= FD_SETSIZE
    poller.register(self.connection, select.POLLIN)
    while not self._gone and self._drained <= MAX_DRAINED_BYTES and poller.poll(0):
      try:  # readable: recv returns at once (data, the end, or the error)
        data = self.connection.recv(4096)
      except OSError:
        data = b""
      self._gone = not data
      self._drained += len(data)
    return self._gone

  def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
    if self.server.verbose:
      super().log_message(format, *args)

  def _send(self, status: int, payload: dict) -> None:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace")
    self.server.count(status)
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      if status >= 400:
        self.send_header("Connection", "close")
      self.end_headers()
      self.wfile.write(body)
    except OSError:  # the client gave up (reset, broken pipe) or does not read (timeout)
      pass

  def _body(self, max_bytes: int) -> bytes:
    """The request body; BodyError (411, 400, 413, 408) when Content-Length is missing, not an
    integer, repeated, over `max_bytes`, or the body does not arrive in time. A body sent
    chunked (Transfer-Encoding) is refused: one framing, never two to disagree on."""
    lengths = self.headers.get_all("Content-Length") or []
    if self.headers.get("Transfer-Encoding") is not None:
      raise BodyError(400, f"Transfer-Encoding {self.headers['Transfer-Encoding'][:40]!r} is not "
                           f"supported; send Content-Length")
    if not lengths:
      raise BodyError(411, "missing Content-Length header")
    if len(lengths) > 1:
      raise BodyError(400, f"Content-Length given {len(lengths)} times "
                           f"({', '.join(v[:20] for v in lengths[:4])}); send it once")
    length = lengths[0]
    try:
      n = int(length) if len(length) <= 20 else None
    except ValueError:
      n = None
    if n is None:
      raise BodyError(400, f"Content-Length {length[:40]!r} is not an integer")
    if n < 0 or n > max_bytes:
      raise BodyError(413, f"body of {n} bytes; at most {max_bytes}")
    try:
      body = self.rfile.read(n)
    except OSError:
      body = b""
    if len(body) != n:
      raise BodyError(408, f"body ended after {len(body)} of {n} bytes (read timeout "
                           f"{self.server.limits.read_timeout_s:g} s)")
    return body


LINGER_S = 2.0  # how long a refused connection is read after its answer (see `_refuse_loop`)
_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
_KINDS = {408: "request_timeout", 431: "invalid_request_error", 503: "server_busy"}


def _refusal(status: int, message: str) -> bytes:
  """A whole HTTP/1.0 answer, in the OpenAI error shape both servers' clients read."""
  body = json.dumps({"error": {"message": message, "type": _KINDS[status],
                               "param": None}}).encode()
  return (f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
          f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def ensure_fd_limit(limits: HttpLimits, label: str) -> int:
  """The open-file limit raised (soft, up to the hard one) so that every socket the limits allow
  fits: the connections still sending, the requests being handled, 256 lingering refusals and
  64 spare; a warning naming the fields when it cannot be. -> the soft limit."""
  import resource

  need = limits.max_incomplete + limits.max_connections + 256 + 64
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft < need:
    raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
      resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
      soft = raised
    except (ValueError, OSError):
      pass
  if soft < need:
    log.warning("%s: open-file limit %d < %d sockets that max_incomplete + max_connections allow; "
                "accepts past it fail (raise ulimit -n or lower them)", label, soft, need)
  return soft


class JsonServer(ThreadingHTTPServer):
  """A threaded server that counts its answers, reads each request whole before it gets a
  thread (`Intake`: a budget for connections still sending, and `limits.read_timeout_s`), caps
  the requests being handled (503), and on `server_close` drains its `batcher` (set by the
  subclass after binding) before it returns."""

  daemon_threads = True
  request_queue_size = 128  # listen backlog; the default 5 refuses bursts of clients
  url_path = ""  # `url` is http://host:port + this
  label = "server"  # in logged errors

  def __init__(self, address, handler, verbose: bool = False, limits: HttpLimits | None = None):
    self.limits = limits or HttpLimits()
    super().__init__(address, handler)
    self.verbose = verbose
    self.batcher = None
    self.requests = self.errors = 0  # answered requests, and how many of them were 4xx/5xx
    self.refused = 0  # whole requests refused at the cap of requests being handled
    self.closing = False
    self._lock = threading.Lock()
    self._open = 0  # requests being handled
    self._refuser = self._refusals = None
    self._request_bytes: dict = {}  # socket -> its request, read whole, until its handler starts
    ensure_fd_limit(self.limits, self.label)
    self._intake = Intake(self.limits, self._dispatch, self._answer_intake, f"{self.label}-intake")

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{host}:{port}{self.url_path}"

  def count(self, status: int) -> None:
    with self._lock:
      self.requests += 1
      self.errors += status >= 400

  # --- connections: read whole first (the intake), then a thread each, up to a cap

  @property
  def timeouts(self) -> int:
    """Connections cut (408) for not sending their request within `read_timeout_s`."""
    return self._intake.timeouts

  @property
  def evicted(self) -> int:
    """Connections cut (408) while still sending, to keep within the incomplete budget."""
    return self._intake.evicted

  @property
  def incomplete_connections(self) -> int:
    return self._intake.incomplete

  def process_request(self, request, client_address):
    """On the accepting thread: the connection waits in the intake until its request is whole."""
    if self.closing:
      return self._refuse(request)
    self._intake.add(request, client_address)

  def _dispatch(self, request, client_address, data: bytes) -> None:
    """On the intake's thread: a whole request gets a handler thread, or 503 at the cap."""
    with self._lock:
      full = self.closing or self._open >= self.limits.max_connections
      if not full:
        self._open += 1
        self._request_bytes[request] = data
    if full:
      return self._refuse(request)
    try:
      ThreadingMixIn.process_request(self, request, client_address)
    except Exception:  # noqa: BLE001 -- could not start a thread: answer as busy
      with self._lock:
        self._open -= 1
        self._request_bytes.pop(request, None)
      self._refuse(request)

  def take_request_bytes(self, request) -> bytes | None:
    with self._lock:
      return self._request_bytes.pop(request, None)

  def _answer_intake(self, request, status: int, message: str) -> None:
    self.count(status)
    self._queue_refusal(request, _refusal(status, message))

  def process_request_thread(self, request, client_address):
    try:
      super().process_request_thread(request, client_address)
    finally:
      with self._lock:
        self._open -= 1

  def _refuse(self, request) -> None:
    """A 503 from the refuser thread (not the accepting one)."""
    with self._lock:
      self.refused += 1
    self.count(503)
    self._queue_refusal(request, _refusal(503, "too many connections; try again later"))

  def _queue_refusal(self, request, answer: bytes) -> None:
    """`answer` sent by one refuser thread. Beyond 256 waiting refusals, connections are closed
    unanswered."""
    with self._lock:
      if self._refuser is None:
        self._refusals = queue.Queue(maxsize=256)
        self._refuser = threading.Thread(target=self._refuse_loop, name=f"{self.label}-refuser",
                                         daemon=True)
        self._refuser.start()
    try:
      self._refusals.put_nowait((request, answer))
    except queue.Full:
      self.shutdown_request(request)

  def _refuse_loop(self) -> None:
    """Answers each refused connection, then keeps reading what its client sends (a lingering
    close, up to 256 connections at once on one selector) until the client closes, LINGER_S
    pass or 64 KiB arrive: closing with unread bytes resets the connection, and a reset can discard
    the answer before a slow client reads it, or break the send of a client that was still
    writing."""
    lingering = selectors.DefaultSelector()
    while True:
      try:
        request, answer = self._refusals.get(timeout=0.05 if lingering.get_map() else None)
      except queue.Empty:
        request = None
      if request is not None:
        try:
          request.settimeout(0.5)
          request.sendall(answer)
          request.shutdown(socket.SHUT_WR)
          if len(lingering.get_map()) >= 256:  # bounded: past that, closed at once
            raise OSError("too many lingering connections")
          request.setblocking(False)
          lingering.register(request, selectors.EVENT_READ,
                             [time.monotonic() + LINGER_S, 64 << 10])
        except OSError:
          request.close()
      now = time.monotonic()
      for key, _ in lingering.select(timeout=0):
        try:
          data = key.fileobj.recv(4096)
        except OSError:
          data = b""
        key.data[1] -= len(data)
        if not data or key.data[1] <= 0:
          key.data[0] = 0.0  # closed by the client, or enough read
      for key in [k for k in lingering.get_map().values() if k.data[0] <= now]:
        lingering.unregister(key.fileobj)
        key.fileobj.close()

  @property
  def open_connections(self) -> int:
    return self._open

  # --- errors and shutdown

  def handle_error(self, request, client_address):
    """One line per error, no traceback: a client's connection trouble at debug level."""
    error = sys.exc_info()[1]
    level = logging.DEBUG if isinstance(error, (ConnectionError, TimeoutError)) else logging.ERROR
    log.log(level, "%s: %s while handling %s: %.200s", self.label, type(error).__name__,
            client_address[0] if client_address else "?", error)

  def server_close(self):
    """Stops accepting, lets the batcher finish (or answer 503) what is queued within
    `limits.shutdown_grace_s`, joins it, and waits for the handlers to write their answers."""
    if not hasattr(self, "_intake"):  # binding failed inside __init__
      return super().server_close()
    with self._lock:
      already, self._drained, self.closing = getattr(self, "_drained", False), True, True
    self._intake.stop()  # before ThreadingMixIn joins the handler threads the intake starts
    super().server_close()
    if already:
      return
    deadline = time.monotonic() + self.limits.shutdown_grace_s
    if self.batcher is not None:
      self.batcher.close(self.limits.shutdown_grace_s)
    # every queued request now has its answer (a round in progress may outlast the grace): 5 s
    # more for the handlers to write them
    deadline = max(deadline, time.monotonic()) + 5
    while self._open and time.monotonic() < deadline:
      time.sleep(0.02)


class QueueWorker:
  """One thread that serves queued requests in rounds, so that concurrent HTTP handlers share
  one model or encoder call: a round is the first waiting item plus whatever else is already
  queued (no added wait) while `_room(items)` says so. Items are tuples ending in a Future.
  At most `max_queue` items wait (`Unavailable` beyond it; items whose Future was cancelled are
  dropped first); a round may put unfinished items back at the end of the queue (`_requeue`),
  which is how long requests take turns."""

  thread_name = "batcher"

  def __init__(self, max_queue: int = 256):
    if max_queue < 1:
      raise ValueError(f"max_queue must be >= 1, got {max_queue}")
    self.max_queue = max_queue
    self.dropped = 0  # items whose Future was cancelled (the client left): never run again
    self._queue: collections.deque = collections.deque()
    self._cv = threading.Condition()
    self._closing = False
    self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
    self._thread.start()

  def qsize(self) -> int:
    with self._cv:
      return len(self._queue)

  def _submit(self, *payload):
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._put((*payload, future))
    return future.result()

  def _put(self, item) -> None:
    with self._cv:
      if self._closing:
        raise Unavailable("server is shutting down")
      if len(self._queue) >= self.max_queue:  # items whose client left first
        kept = [i for i in self._queue if not self._future(i).cancelled()]
        self.dropped += len(self._queue) - len(kept)
        self._queue = collections.deque(kept)
      if len(self._queue) >= self.max_queue:
        raise Unavailable(f"server busy: {len(self._queue)} requests queued (at most "
                          f"{self.max_queue}); try again later")
      self._queue.append(item)
      self._cv.notify()

  def _requeue(self, item) -> None:
    with self._cv:
      self._queue.append(item)

  @staticmethod
  def _future(item) -> concurrent.futures.Future:
    return item[-1]

  def close(self, grace_s: float = 30.0) -> None:
    """Takes no more items; the worker serves what is queued for up to `grace_s`, then what is
    left is answered Unavailable; returns once the worker thread has ended (its current round,
    bounded by the per-request limits, always finishes: never a thread killed inside a model
    call)."""
    with self._cv:
      self._closing = True
      self._cv.notify_all()
    self._thread.join(timeout=grace_s)
    with self._cv:
      left = list(self._queue)
      self._queue.clear()
    self._fail(left, Unavailable("server is shutting down"))
    self._thread.join()

  def _room(self, items: list) -> bool:
    return True

  def _round(self, items: list) -> None:
    raise NotImplementedError

  @classmethod
  def _fail(cls, items: list, error: Exception) -> None:
    for item in items:
      settle(cls._future(item), error=error)

  def _loop(self) -> None:
    while True:
      with self._cv:
        while not self._queue and not self._closing:
          self._cv.wait()
        if not self._queue:
          return
        items = [self._queue.popleft()]
        while self._queue and self._room(items):
          items.append(self._queue.popleft())
      try:
        self._round(items)
      except Exception as e:  # noqa: BLE001 -- a dead worker would hang every later request
        log.error("%s: unexpected %s: %.200s", self.thread_name, type(e).__name__, e)
        self._fail(items, e)


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


def define_limit_flags(cls, skip=()):
  """An absl flag per field of the limits dataclass `cls` (but `skip`); returns a function
  `(**overrides) -> cls` reading them (call it after flags are parsed)."""
  from absl import flags

  holders = {}
  for f in dataclasses.fields(cls):
    if f.name in skip:
      continue
    define = (flags.DEFINE_bool if isinstance(f.default, bool) else
              flags.DEFINE_float if isinstance(f.default, float) else flags.DEFINE_integer)
    holders[f.name] = define(f.name, f.default, f"Server limit {cls.__name__}.{f.name}.")
  return lambda **overrides: cls(**{n: h.value for n, h in holders.items()}, **overrides)


def serve_until_stopped(server: JsonServer) -> None:
  """serve_forever until Ctrl-C or SIGTERM, then `server_close` (graceful: stop accepting,
  finish or answer queued requests, join the worker) so that the process exits 0, never with a
  model call killed mid-flight."""
  import signal

  def stop(signum, frame):  # shutdown() waits for serve_forever: call it from another thread
    threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

  previous = signal.signal(signal.SIGTERM, stop)
  try:
    server.serve_forever(poll_interval=0.1)
  except KeyboardInterrupt:
    pass
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the drain
    server.server_close()
    signal.signal(signal.SIGTERM, previous)
