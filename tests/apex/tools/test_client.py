"""SearchClient against scripted fake servers: retries, timeouts, concurrency and rate limits."""

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apex_jax.tools import (SearchClient, SearchError, SearchRequestError, SearchTimeout,
                            SearchUnavailable, TokenBucket)

OK = {"result": [[{"document": {"id": "7", "contents": '"T"\ntext'}, "score": 0.5}]]}


class FakeServer(ThreadingHTTPServer):
  """Answers each POST with the next (status, payload, delay_s) of `script`, then 200 OK."""
  daemon_threads = True

  def __init__(self, script=(), delay_s=0.0):
    super().__init__(("127.0.0.1", 0), _FakeHandler)
    self.script, self.delay_s = list(script), delay_s
    self.calls = self.in_flight = self.max_in_flight = 0
    self.lock = threading.Lock()
    self.release = threading.Event()  # ends sleeps early at shutdown

  @property
  def url(self):
    return f"http://127.0.0.1:{self.server_address[1]}/retrieve"


class _FakeHandler(BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):
    srv = self.server
    self.rfile.read(int(self.headers["Content-Length"]))
    with srv.lock:
      srv.calls += 1
      srv.in_flight += 1
      srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
      status, payload, delay = srv.script.pop(0) if srv.script else (200, OK, srv.delay_s)
    srv.release.wait(delay)
    with srv.lock:
      srv.in_flight -= 1
    body = json.dumps(payload).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):
      pass


@contextlib.contextmanager
def fake_server(script=(), delay_s=0.0):
  srv = FakeServer(script, delay_s)
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try:
    yield srv
  finally:
    srv.release.set()
    srv.shutdown()
    srv.server_close()


class Sleeps:
  """An injectable sleep that records and does not wait."""

  def __init__(self):
    self.calls = []

  def __call__(self, seconds):
    self.calls.append(seconds)


@pytest.mark.parametrize("status", [503, 500, 429])
def test_retries_after_two_failures_then_succeeds(status):
  sleeps = Sleeps()
  err = {"error": "busy"}
  with fake_server([(status, err, 0), (status, err, 0)]) as srv:
    client = SearchClient(srv.url, retries=3, backoff_s=0.5, jitter=0.0, sleep=sleeps)
    results = client.search(["q"])
  assert [[(p.id, p.title, p.text, p.score) for p in r] for r in results] == [
      [("7", "T", "text", 0.5)]]
  assert srv.calls == 3 and sleeps.calls == [0.5, 1.0]  # exponential backoff
  stats = client.stats()
  assert (stats["requests"], stats["retries"], stats["failures"]) == (3, 2, 0)


def test_gives_up_after_the_retries():
  sleeps = Sleeps()
  with fake_server([(503, {"error": "down"}, 0)] * 5) as srv:
    client = SearchClient(srv.url, retries=2, backoff_s=1.0, max_backoff_s=1.5, sleep=sleeps)
    with pytest.raises(SearchUnavailable, match="HTTP 503: down") as e:
      client.search(["q"])
  assert e.value.attempts == 3 and e.value.status == 503 and srv.calls == 3
  assert len(sleeps.calls) == 2 and 0.9 <= sleeps.calls[0] <= 1.1 and sleeps.calls[1] <= 1.5 * 1.1
  assert client.stats()["failures"] == 1 and client.stats()["retries"] == 2


@pytest.mark.parametrize("status", [400, 404, 422])
def test_4xx_is_not_retried(status):
  sleeps = Sleeps()
  with fake_server([(status, {"error": "field 'topk' must be an integer"}, 0)]) as srv:
    client = SearchClient(srv.url, retries=5, sleep=sleeps)
    with pytest.raises(SearchRequestError, match="must be an integer") as e:
      client.search(["q"])
  assert e.value.status == status and e.value.attempts == 1
  assert srv.calls == 1 and sleeps.calls == [] and client.stats()["failures"] == 1


def test_malformed_response_is_an_error_and_not_retried():
  with fake_server([(200, {"result": []}, 0)]) as srv:  # 0 lists for 1 query
    client = SearchClient(srv.url, retries=3, sleep=Sleeps())
    with pytest.raises(SearchError, match="malformed /retrieve response"):
      client.search(["q"])
  assert srv.calls == 1


def test_results_without_scores_are_accepted():
  payload = {"result": [[{"id": "1", "contents": '"A"\nx'}], []]}
  with fake_server([(200, payload, 0)]) as srv:
    results = SearchClient(srv.url).search(["a", "b"])
  assert [[(p.id, p.score) for p in r] for r in results] == [[("1", None)], []]


def test_timeout_against_a_server_that_sleeps():
  sleeps = Sleeps()
  with fake_server(delay_s=5.0) as srv:
    client = SearchClient(srv.url, timeout_s=0.2, retries=1, sleep=sleeps)
    start = time.perf_counter()
    with pytest.raises(SearchTimeout, match="timed out") as e:
      client.search(["q"])
    elapsed = time.perf_counter() - start
  assert e.value.attempts == 2 and srv.calls == 2 and len(sleeps.calls) == 1
  assert elapsed < 4.5  # two 0.2 s timeouts, not the server's 5 s sleep (10 s in all)


def test_connection_refused_is_retried():
  with socket.socket() as s:  # a port nobody listens on once closed
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  sleeps = Sleeps()
  client = SearchClient(f"http://127.0.0.1:{port}", retries=2, sleep=sleeps)
  with pytest.raises(SearchUnavailable) as e:
    client.search(["q"])
  assert e.value.attempts == 3 and len(sleeps.calls) == 2 and e.value.status is None


def test_concurrency_limit_holds_across_threads():
  with fake_server(delay_s=0.1) as srv:
    client = SearchClient(srv.url, max_concurrency=2)
    threads = [threading.Thread(target=client.search, args=(["q"],)) for _ in range(6)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=30)
  assert srv.calls == 6
  assert 1 <= srv.max_in_flight <= 2 and client.stats()["max_in_flight"] <= 2
  assert client.stats()["in_flight"] == 0


class FakeClock:
  """Time that moves only when the injected sleep is called."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_client_rate_limit_counted_with_a_fake_clock():
  clock = FakeClock()
  granted = []
  with fake_server() as srv:
    client = SearchClient(srv.url, rate_limit_per_s=5, burst=1, clock=clock, sleep=clock.sleep)
    for _ in range(11):
      client.search(["q"])
      granted.append(clock.now)
  assert srv.calls == 11
  # 5 per second with a burst of 1: requests go at 0, 0.2, ..., 2.0
  assert sum(t < 1.0 - 1e-9 for t in granted) == 5
  assert sum(t < 2.0 - 1e-9 for t in granted) == 10
  assert clock.now == pytest.approx(2.0)


def test_token_bucket_is_thread_safe_and_counts_grants_per_window():
  """Many threads, a clock that never moves: the grant times the bucket hands out must still
  put at most burst + rate grants in any one-second window."""
  bucket = TokenBucket(rate=10, burst=3, clock=lambda: 0.0, sleep=lambda s: None)
  grants, lock = [], threading.Lock()

  def worker():
    for _ in range(25):
      t = bucket.acquire()
      with lock:
        grants.append(t)

  threads = [threading.Thread(target=worker) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  grants.sort()
  assert len(grants) == 200
  assert grants[:3] == [0.0, 0.0, 0.0]  # the burst
  for i, start in enumerate(grants):
    in_window = sum(1 for t in grants[i:] if t < start + 1.0 - 1e-9)
    assert in_window <= 10 + 3
  assert grants[-1] == pytest.approx((200 - 3) / 10)


def test_token_bucket_refills_with_time():
  clock = FakeClock()
  bucket = TokenBucket(rate=2, burst=2, clock=clock, sleep=clock.sleep)
  assert [bucket.acquire() for _ in range(3)] == [0.0, 0.0, 0.5]
  clock.now = 10.0  # idle long enough to refill, but only up to the burst
  assert [bucket.acquire() for _ in range(3)] == [10.0, 10.0, 10.5]


def test_client_rejects_bad_arguments():
  with pytest.raises(ValueError, match="not an http"):
    SearchClient("localhost:8000")
  with pytest.raises(ValueError, match="retries >= 0"):
    SearchClient("http://x", retries=-1)
  with pytest.raises(TypeError, match="list of strings"):
    SearchClient("http://x").search("a single string")
  assert SearchClient("http://127.0.0.1:1").search([]) == []  # nothing to send
