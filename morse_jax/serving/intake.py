"""Reading requests before they get a worker thread: one thread, one selector, a budget.

A connection a `JsonServer` accepts first waits here, costing a socket and its buffered bytes but
no thread, until its request has arrived whole (the request line, the headers, and the
`Content-Length` bytes of body). Only then is it handed to a worker (`on_complete`), so a client
that sends its request promptly always reaches a worker, however many others are still sending.

Connections still sending are bounded (`HttpLimits.max_incomplete` in all,
`max_incomplete_per_address` from one address, `max_incomplete_bytes` buffered): over a bound,
the address holding the most (over the per-address bound: that address) loses its
longest-waiting connection that has sent part of a request and stalled, or, when none has, its
longest-waiting one; it is answered 408 and closed. That order is what protects good clients on
the attacker's own address (loopback): a prompt client's connection either holds its whole
request (and leaves for a worker) or nothing yet, and a slow sender holding part of one goes
first; among connections that sent nothing, the newest is the last to go. Each connection also has `read_timeout_s` from its accept to send its whole request (408).
"""

from __future__ import annotations

import collections
import logging
import re
import selectors
import socket
import threading
import time

log = logging.getLogger(__name__)
_HEADERS_END = re.compile(rb"\r?\n\r?\n")  # the empty line after the headers


class _Pending:
  __slots__ = ("sock", "address", "buffer", "deadline", "header_end", "need")

  def __init__(self, sock, address, deadline: float):
    self.sock, self.address, self.deadline = sock, address, deadline
    self.buffer = bytearray()
    self.header_end = None  # offset just past the headers, once they have arrived
    self.need = None  # bytes the whole request has (headers + body), once known


def body_length(head: bytes, max_body_bytes: int) -> int:
  """The body bytes to wait for after the headers `head`: the one `Content-Length` when it is a
  valid integer within `max_body_bytes`, else 0 (the worker answers the missing, repeated,
  malformed or oversized header without reading a body)."""
  values = []
  for line in head.split(b"\n")[1:]:
    name, sep, value = line.partition(b":")
    if sep and name.strip().lower() == b"content-length":
      values.append(value.strip())
  if len(values) != 1 or not values[0].isdigit() or len(values[0]) > 20:
    return 0
  n = int(values[0])
  return n if n <= max_body_bytes else 0


class Intake:
  """Buffers accepted connections until their request is whole, within the budget above.
  `on_complete(sock, address, data)` runs on this thread for a whole request;
  `on_reject(sock, status, message)` for a connection cut (408, 431) that the client is still
  connected to."""

  def __init__(self, limits, on_complete, on_reject, name: str = "intake"):
    self.limits = limits
    self._on_complete, self._on_reject = on_complete, on_reject
    self._selector = selectors.DefaultSelector()
    self._wake_r, self._wake_w = socket.socketpair()
    self._wake_r.setblocking(False)
    self._wake_w.setblocking(False)
    self._selector.register(self._wake_r, selectors.EVENT_READ)
    self._lock = threading.Lock()
    self._arrivals: collections.deque = collections.deque()
    self._pending: dict = {}  # sock -> _Pending, in the order accepted (oldest first)
    self._per_address: collections.Counter = collections.Counter()
    self._bytes = 0
    self._stopped = False
    self.timeouts = self.evicted = self.hung_up = 0  # cut at the deadline, over budget, gone
    self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
    self._thread.start()

  @property
  def incomplete(self) -> int:
    return len(self._pending)

  def add(self, sock, address) -> None:
    """From the accepting thread: a new connection to read (closed if the intake has stopped)."""
    with self._lock:
      if not self._stopped:
        self._arrivals.append((sock, address, time.monotonic()))
        sock = None
    if sock is not None:
      sock.close()
      return
    try:
      self._wake_w.send(b"x")
    except OSError:  # BlockingIOError: a wake-up is already waiting
      pass

  def stop(self) -> None:
    """Ends the thread; connections still sending are closed unanswered."""
    with self._lock:
      self._stopped = True
    try:
      self._wake_w.send(b"x")
    except OSError:
      pass
    self._thread.join(timeout=10)

  # --- the thread

  def _loop(self) -> None:
    try:
      while not self._stopped:
        try:
          self._round()
        except Exception as e:  # noqa: BLE001 -- a dead intake would refuse every client
          log.error("%s: unexpected %s: %.200s", self._thread.name, type(e).__name__, e)
          time.sleep(0.01)
    finally:
      with self._lock:
        self._stopped = True
        arrivals = [sock for sock, _, _ in self._arrivals]
        self._arrivals.clear()
      for sock in arrivals + list(self._pending):
        sock.close()
      self._pending.clear()
      self._selector.close()
      self._wake_r.close()
      self._wake_w.close()

  def _round(self) -> None:
    oldest = next(iter(self._pending.values()), None)
    wait = 0.25 if oldest is None else min(0.25, max(0.0, oldest.deadline - time.monotonic()))
    for key, _ in self._selector.select(timeout=wait):
      if key.fileobj is self._wake_r:
        self._drain_wake()
      elif key.fileobj in self._pending:  # not cut earlier in this round
        self._read(key.data)
    self._register_arrivals()
    self._expire(time.monotonic())
    self._enforce_budget()

  def _drain_wake(self) -> None:
    try:
      while self._wake_r.recv(4096):
        pass
    except OSError:
      pass

  def _register_arrivals(self) -> None:
    with self._lock:
      arrivals = list(self._arrivals)
      self._arrivals.clear()
    for sock, address, accepted in arrivals:
      p = _Pending(sock, address, accepted + self.limits.read_timeout_s)
      try:
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, p)
      except (OSError, ValueError):
        sock.close()
        continue
      self._pending[sock] = p
      self._per_address[address[0] if address else None] += 1

  def _read(self, p: _Pending) -> None:
    try:
      data = p.sock.recv(65536)
    except (BlockingIOError, InterruptedError):
      return
    except OSError:
      data = b""
    if not data:  # the client hung up before its request was whole: nothing to answer
      self.hung_up += 1
      self._forget(p)
      p.sock.close()
      return
    start = max(0, len(p.buffer) - 3)
    p.buffer += data
    self._bytes += len(data)
    if p.header_end is None:
      found = _HEADERS_END.search(p.buffer, start)
      limit = self.limits.max_header_bytes
      if found is None and len(p.buffer) <= limit:
        return
      if found is None or found.end() > limit:
        return self._reject(p, 431, f"request line and headers over {limit} bytes")
      p.header_end = found.end()
      p.need = p.header_end + body_length(bytes(p.buffer[:p.header_end]),
                                          self.limits.max_body_bytes)
    if len(p.buffer) >= p.need:
      if self._hand_off(p):
        self._on_complete(p.sock, p.address, bytes(p.buffer))

  def _forget(self, p: _Pending) -> None:
    try:
      self._selector.unregister(p.sock)
    except (KeyError, ValueError, OSError):
      pass
    del self._pending[p.sock]
    address = p.address[0] if p.address else None
    self._per_address[address] -= 1
    if not self._per_address[address]:
      del self._per_address[address]
    self._bytes -= len(p.buffer)

  def _reject(self, p: _Pending, status: int, message: str) -> None:
    if self._hand_off(p):
      self._on_reject(p.sock, status, message)

  def _hand_off(self, p: _Pending) -> bool:
    """Takes p out of the intake with its socket blocking again, for a worker to answer;
    False (socket closed) when the socket is already unusable."""
    self._forget(p)
    try:
      p.sock.setblocking(True)
    except OSError:
      p.sock.close()
      return False
    return True

  def _expire(self, now: float) -> None:
    while self._pending:
      p = next(iter(self._pending.values()))
      if p.deadline > now:
        return
      self.timeouts += 1
      self._reject(p, 408, f"request not received whole within {self.limits.read_timeout_s:g} s")

  def _enforce_budget(self) -> None:
    lim = self.limits
    for address in [a for a, held in self._per_address.items()
                    if held > lim.max_incomplete_per_address]:
      while self._per_address.get(address, 0) > lim.max_incomplete_per_address:
        self._evict(address, f"{self._per_address[address]} connections from your address "
                             f"still sending (at most {lim.max_incomplete_per_address})")
    while self._pending and (len(self._pending) > lim.max_incomplete
                             or self._bytes > lim.max_incomplete_bytes):
      address = self._per_address.most_common(1)[0][0]
      self._evict(address, f"{len(self._pending)} connections still sending, {self._bytes} bytes "
                           f"buffered (at most {lim.max_incomplete}, {lim.max_incomplete_bytes})")

  def _evict(self, address, why: str) -> None:
    """The longest-waiting connection of `address` that has sent part of its request and
    stalled (slowloris' signature), else its longest-waiting one that has sent nothing yet (a
    client just connected may be about to send): answered 408, closed. A candidate is read
    once more first: bytes that arrived since this round's select may complete its request,
    and then it is handed on instead (the next one is the candidate)."""
    mine = [p for p in self._pending.values() if (p.address[0] if p.address else None) == address]
    for p in [p for p in mine if p.buffer] + [p for p in mine if not p.buffer]:
      self._read(p)
      if p.sock not in self._pending or self._pending[p.sock] is not p:
        continue  # completed (or hung up) just now: no longer holding the budget
      self.evicted += 1
      return self._reject(p, 408, f"request not received whole in time: {why}; the "
                                  f"longest-waiting was closed")
