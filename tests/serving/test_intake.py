"""Connections still sending their request hold no thread and have a budget: slow or idle
sockets past it are cut longest-waiting first (from the address holding the most), so a client
that sends its request promptly always gets an answer, on the attackers' own address too. The
second loopback address (127.0.0.2) stands for another client; nothing leaves the machine."""

import socket
import time

import pytest

from apex_jax.tools import server
from morse_jax.serving.intake import body_length
from tests.apex.tools.test_hardening import post, raw, retriever  # noqa: F401 -- a fixture
from tests.apex.tools.test_server import wait_until

SLOW_HEAD = b"POST /retrieve HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"
LIMITS = server.SearchLimits(max_connections=4, read_timeout_s=5.0, max_incomplete=6,
                             max_incomplete_per_address=4, max_incomplete_bytes=4096,
                             max_header_bytes=512)


@pytest.fixture
def srv(retriever):  # noqa: F811
  with server.running(server.make_server(retriever, "127.0.0.1", 0, limits=LIMITS)) as s:
    yield s


def slow(srv, source="127.0.0.1", data=SLOW_HEAD):
  """A connection that sends `data` and holds; returns once the server is holding it."""
  seen = lambda: srv.incomplete_connections + srv.evicted  # noqa: E731
  before = seen()
  s = socket.create_connection(srv.server_address[:2], timeout=5, source_address=(source, 0))
  s.sendall(data)
  wait_until(lambda: seen() > before, timeout_s=10)
  return s


def answer(s, timeout=5.0) -> bytes:
  """What the server sent before closing (b"" when nothing, or still open after `timeout`)."""
  s.settimeout(timeout)
  reply = b""
  try:
    while chunk := s.recv(4096):
      reply += chunk
  except OSError:
    pass
  return reply


def test_body_length_reads_one_valid_content_length():
  head = b"POST / HTTP/1.1\r\nHost: x\r\ncontent-LENGTH:  12 \r\n\r\n"
  assert body_length(head, 100) == 12
  assert body_length(head, 11) == 0  # over the limit: answered 413 without a body
  assert body_length(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                     100) == 0
  assert body_length(b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 100) == 0
  assert body_length(b"GET / HTTP/1.1\r\n\r\n", 100) == 0


def test_prompt_clients_are_answered_while_slow_ones_fill_every_budget(srv):
  held = [slow(srv) for _ in range(4)]  # the per-address budget, full
  assert srv.incomplete_connections == 4 and srv.open_connections == 0
  for _ in range(3):  # each good request evicts the longest-waiting slow one of its address
    assert post(srv, b'{"queries": ["x"]}')[0] == 200
    held.append(slow(srv))  # and the attacker refills
  assert srv.evicted == 3
  for s in held[:3]:
    reply = answer(s)
    assert reply.startswith(b"HTTP/1.0 408"), reply
    assert b"5 connections from your address still sending (at most 4)" in reply
  for s in held[3:]:  # the newer slow ones are still held
    s.setblocking(False)
    with pytest.raises(BlockingIOError):
      s.recv(1)
  for s in held:
    s.close()


def test_over_the_total_budget_the_address_holding_most_loses_its_oldest(srv):
  other = [slow(srv, "127.0.0.2") for _ in range(2)]
  mine = [slow(srv) for _ in range(4)]  # 6 held: the total budget
  newest = slow(srv)  # 127.0.0.1 holds 5 > 4: its oldest goes
  assert answer(mine[0]).startswith(b"HTTP/1.0 408")
  another = slow(srv, "127.0.0.2")  # 7 > 6 in all: again 127.0.0.1's oldest (it holds 4)
  reply = answer(mine[1])
  assert reply.startswith(b"HTTP/1.0 408") and b"7 connections still sending" in reply
  assert srv.evicted == 2 and srv.incomplete_connections == 6
  for s in other:  # the other address kept both
    s.setblocking(False)
    with pytest.raises(BlockingIOError):
      s.recv(1)
  for s in other + mine + [newest, another]:
    s.close()


def test_buffered_bytes_have_a_budget_and_headers_a_size_limit(srv):
  big = b"POST /retrieve HTTP/1.1\r\nContent-Length: 3000\r\n\r\n" + b"a" * 2500
  first = slow(srv, data=big)
  second = slow(srv, data=big)  # 5000 bytes buffered > 4096: the older is cut
  assert answer(first).startswith(b"HTTP/1.0 408") and srv.evicted == 1
  second.close()
  status, body = raw(srv, b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 600 + b"\r\n\r\n")
  assert status == 431 and "headers over 512 bytes" in body["error"]["message"]


def test_duplicate_content_length_and_chunked_bodies_are_400(srv):
  status, body = raw(srv, b"POST /retrieve HTTP/1.1\r\nContent-Length: 2\r\n"
                          b"Content-Length: 2\r\n\r\n{}")
  assert status == 400 and "Content-Length given 2 times" in body["error"], body
  assert body["field"] == "Content-Length"
  status, body = raw(srv, b"POST /retrieve HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                          b"Content-Length: 2\r\n\r\n{}")
  assert status == 400 and "Transfer-Encoding 'chunked' is not supported" in body["error"]


def test_idle_connections_hold_no_thread_and_are_cut_at_the_deadline(retriever):  # noqa: F811
  limits = server.SearchLimits(max_connections=2, read_timeout_s=0.5)
  with server.running(server.make_server(retriever, "127.0.0.1", 0, limits=limits)) as s:
    idle = [socket.create_connection(s.server_address[:2], timeout=5) for _ in range(10)]
    wait_until(lambda: s.incomplete_connections == 10)
    assert post(s, b'{"queries": ["x"]}')[0] == 200  # 10 idle, 2 threads: still answered
    start = time.monotonic()
    assert all(answer(c).startswith(b"HTTP/1.0 408") for c in idle)
    assert time.monotonic() - start < 3.0 and s.timeouts == 10
    for c in idle:
      c.close()


def test_open_file_limit_is_raised_to_fit_the_budget():
  """In a process of its own (the limit is process-wide): 256 + 64 + 256 + 64 = 640 sockets."""
  import subprocess
  import sys

  from tests import test_configs

  code = ("import resource, sys; from morse_jax.serving.http import HttpLimits, ensure_fd_limit; "
          "resource.setrlimit(resource.RLIMIT_NOFILE, (100, int(sys.argv[1]))); "
          "print(ensure_fd_limit(HttpLimits(), 'srv'))")
  for hard, soft in ((5000, "640"), (200, "200")):
    out = subprocess.run([sys.executable, "-c", code, str(hard)], cwd=test_configs.ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == soft, out.stderr[-2000:]
    assert ("open-file limit 200 < 640" in out.stderr) == (hard == 200), out.stderr[-2000:]


def test_stalled_partial_requests_go_before_connections_that_sent_nothing_yet(srv):
  just_connected = slow(srv, data=b"")  # opened first: the oldest, but it sent nothing
  stalled = [slow(srv) for _ in range(4)]  # 5 from 127.0.0.1 > 4: a stalled one goes
  assert answer(stalled[0]).startswith(b"HTTP/1.0 408") and srv.evicted == 1
  just_connected.sendall(b"GET /health HTTP/1.1\r\n\r\n")
  assert answer(just_connected).startswith(b"HTTP/1.0 200")
  for s in stalled:
    s.close()
