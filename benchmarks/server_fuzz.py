"""Loopback fuzz / load test of our two HTTP servers: good requests sent concurrently with hostile
ones, and what the good ones saw.

  python -m benchmarks.server_fuzz [--servers=search,chat --requests=200 --seconds=60
                                    --dropped=100 --out=benchmarks/results/server_fuzz.json]

Each server runs in this process on 127.0.0.1 with a tiny stand-in behind it: the search server
over a 200-passage index embedded by a hash encoder (which, like a real tokenizer, fails on a
lone surrogate), the chat server over a tiny random qwen3 with the tests' word-level tokenizer.
Per server, three phases: warm-up (compiles), `baseline` (good requests alone) and `attack` (the
same good requests while hostile clients cycle through the cases below). With --attack_rounds=k
each phase runs k rounds and the last is reported, earlier ones compiling the sampler shapes that
merged requests reach: on a CPU an XLA compile takes seconds and shows in p99, so each round
reports its compiles. Bounded: at most `--requests` good requests and `--seconds` per round.

Hostile cases: lone surrogates, JSON nested 100k deep, a 4300-digit integer, NaN / Infinity /
negative / huge numbers, wrong types, bad JSON, non-UTF-8, an oversized body (413), an 8 MB chat
message, a client chat template with a nested Jinja loop, slowloris clients (a header byte every
half second), a flood of idle connections past the connection cap, and (chat) long legitimate requests at the
max_tokens cap. Then, per `--slow_sockets` count (80, 400), a slow-body phase: that many
connections send `POST` headers with `Content-Length: 100` and one body byte and hold, reopened
whenever the server cuts them, while the same good requests run; every one must be answered 200.
Then (chat; `--dropped` k, 0 for none) a dropped-clients phase: k requests at the limits (n =
max_n, max_tokens = the max_tokens limit, temperature 1), half streaming, from 20 threads, each
client gone as soon as its answer begins (a stream) or after 0.3 s (not streaming), while the good
requests keep coming; every one must be answered 200. `--attack_rounds=0` and `--slow_sockets=`
(empty) leave those phases out.

Reported per server: requests tried, answers by status class (good and hostile apart), hostile
connections closed without an answer (slowloris: expected), crashes (must be 0: a good request
with no HTTP answer or a 500, or /health failing afterwards), p50/p99 latency of good requests
with and without attack, success rate and p50/p99 under
each slow-body count, and peak RSS (this process: client and server together); for the dropped
clients, threads before / at the peak / after, the 503s (good requests and connections refused at
the cap), the CPU seconds of this process from the last hang-up until the server is idle again
(no request being handled, nothing queued, no sampler call for 1 s), and the server's counts of
hang-ups and dropped jobs.
"""

from __future__ import annotations

import collections
import http.client
import json
import logging
import os
import resource
import selectors
import socket
import tempfile
import threading
import time
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402

SEARCH_GOOD = [{"queries": [f"w{i} w{i + 1} w{i + 2}"], "topk": 3, "return_scores": True}
               for i in range(40)]
CHAT_MESSAGES = [{"role": "user", "content": "w1 w2 w3"}]
NESTED_JINJA = ("{% for a in range(3000) %}{% for b in range(1000) %}w1 {% endfor %}{% endfor %}")


class HashEncoder:
  """A fixed random unit vector per text; like a real tokenizer it fails on lone surrogates."""

  path, dim = "hash-encoder", 16

  def encode(self, texts):
    rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), self.dim)


def rss_mb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def raw_request(port: int, data: bytes, timeout: float = 30.0) -> int | str:
  """Sends raw bytes; -> the HTTP status, or 'closed' (no answer) / 'timeout'."""
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
      try:
        s.sendall(data)
      except OSError:
        pass  # the server may answer (413) and close before reading it all
      reply = b""
      while b"\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
          break
        reply += chunk
  except socket.timeout:
    return "timeout"
  except OSError:
    return "closed"
  try:
    return int(reply.split(b" ", 2)[1])
  except (IndexError, ValueError):
    return "closed"


def post_bytes(path: str, body: bytes, length: int | None = None) -> bytes:
  n = len(body) if length is None else length
  return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          f"Content-Length: {n}\r\n\r\n").encode() + body


def slowloris(port: int, stop: threading.Event, every_s: float = 0.5) -> str:
  """A header byte every `every_s` until the server closes the connection: -> 'closed' (the
  read deadline worked), 'answered' or 'held' (still open when the phase ended)."""
  head = b"POST /x HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
      for i in range(len(head)):
        if stop.is_set():
          return "held"
        s.sendall(head[i:i + 1])
        time.sleep(every_s)
  except OSError:
    return "closed"
  return "held"


def hold_slow_bodies(port: int, head: bytes, n: int, max_opens: int, conn) -> None:
  """In a process of its own: `n` connections that send `head` and hold, each reopened when the
  server answers or closes it, at most `max_opens` in all, until `conn` gets a message; sends
  the number held once `n` were opened (or after 10 s), then, at the end, its report."""
  sel = selectors.DefaultSelector()
  opened, outcomes, told = 0, collections.Counter(), False
  start = time.monotonic()
  while not conn.poll():
    while len(sel.get_map()) < n and opened < max_opens:
      try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(head)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        opened += 1
      except OSError:
        outcomes["connect_failed"] += 1
        break
    if not told and (opened >= n or time.monotonic() - start > 10):
      conn.send(len(sel.get_map()))
      told = True
    for key, _ in sel.select(timeout=0.05):
      try:
        data = key.fileobj.recv(4096)
      except OSError:
        data = b""
      outcomes[data.split(b"\r\n", 1)[0].decode("latin-1")[:40] or "closed"] += 1
      sel.unregister(key.fileobj)
      key.fileobj.close()
  for key in list(sel.get_map().values()):
    key.fileobj.close()
  if not told:
    conn.send(0)
  conn.send({"sockets": n, "opened": opened, "outcomes": dict(outcomes)})


class SlowBodies:
  """`n` loopback connections that each send a request's headers and the first byte of a
  100-byte body, then hold; one the server closes or answers is reopened (how an attacker keeps
  the pressure on), at most `max_opens` in all. They run in a child process (an attacker does
  not share the server's interpreter lock), on one selector: bounded in sockets (`n`), in opens
  and in time (until the block ends)."""

  def __init__(self, port: int, path: str, n: int, max_opens: int = 20000):
    self.port, self.n, self.max_opens = port, n, max_opens
    self.head = f"POST {path} HTTP/1.1\r\nContent-Length: 100\r\n\r\n{{".encode()
    self.held_at_start, self._report = 0, None

  def __enter__(self):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process running XLA threads
    self._conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=hold_slow_bodies, daemon=True,
                            args=(self.port, self.head, self.n, self.max_opens, child))
    self.proc.start()
    self.held_at_start = self._conn.recv() if self._conn.poll(120) else 0
    return self

  def __exit__(self, *exc):
    try:
      self._conn.send("stop")
      while self._report is None and self._conn.poll(30):
        message = self._conn.recv()
        self._report = message if isinstance(message, dict) else None
    except (OSError, EOFError):
      pass
    self.proc.join(timeout=10)
    if self.proc.is_alive():
      self.proc.kill()

  def report(self) -> dict:
    return self._report or {"sockets": self.n, "opened": None, "outcomes": {}}


def raise_fd_limit(need: int) -> int:
  """The soft limit on open files raised towards the hard one so that `need` fit; -> the limit."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft < need:
    soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
  return soft


def slow_body_phase(port: int, path: str, bodies: list[bytes], n_sockets: int, args) -> dict:
  """Good requests while `n_sockets` slow-body connections hold (and reopen when cut)."""
  with SlowBodies(port, path, n_sockets) as attack:
    result = good_load(port, path, bodies, args["requests"], args["concurrency"],
                       time.monotonic() + args["seconds"])
  result.update(attack.report(), held_at_start=attack.held_at_start)
  ok = result["statuses"].get(200, 0)
  result["success_rate"] = ok / result["tried"] if result["tried"] else 0.0
  return result


def flood(port: int, n: int) -> dict:
  """Opens `n` idle connections at once; -> how many got an immediate answer (408: cut to keep
  within the budget of connections still sending; 503: over a cap)."""
  socks, answered = [], collections.Counter()
  for _ in range(n):
    try:
      socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
      break
  time.sleep(0.3)
  for s in socks:
    s.setblocking(False)
    try:
      status = s.recv(64)[9:12].decode("latin-1")
      if status.isdigit():
        answered[status] += 1
    except OSError:
      pass
  for s in socks:
    s.close()
  return {"opened": len(socks), "answered": dict(answered)}


def search_hostile(port: int, limits) -> dict:
  p = "/retrieve"
  return {
      "lone_surrogate": lambda: raw_request(port, post_bytes(p, b'{"queries": ["\\ud800"]}')),
      "deep_nesting": lambda: raw_request(port, post_bytes(
          p, b'{"queries": ' + b"[" * 100000 + b"]" * 100000 + b"}")),
      "int_4300_digits": lambda: raw_request(port, post_bytes(
          p, b'{"queries": ["a"], "topk": ' + b"9" * 4300 + b"}")),
      "nan_topk": lambda: raw_request(port, post_bytes(p, b'{"queries": ["a"], "topk": NaN}')),
      "inf_topk": lambda: raw_request(port, post_bytes(p, b'{"queries": ["a"], "topk": 1e999}')),
      "negative_topk": lambda: raw_request(port, post_bytes(p, b'{"queries": ["a"], "topk": -5}')),
      "wrong_types": lambda: raw_request(port, post_bytes(p, b'{"queries": [1, {"a": 2}]}')),
      "bad_json": lambda: raw_request(port, post_bytes(p, b'{"queries": [')),
      "not_utf8": lambda: raw_request(port, post_bytes(p, b'{"queries": ["\xff\xfe"]}')),
      "oversized_body": lambda: raw_request(port, post_bytes(
          p, b'{"queries": ["' + b"a" * (limits.max_body_bytes + 10) + b'"]}')),
      "huge_content_length": lambda: raw_request(port, post_bytes(p, b"{}", length=10**15)),
      "many_queries": lambda: raw_request(port, post_bytes(
          p, json.dumps({"queries": ["a"] * (limits.max_queries + 1)}).encode())),
      "long_query": lambda: raw_request(port, post_bytes(
          p, json.dumps({"queries": ["a " * limits.max_query_chars]}).encode())),
  }


def chat_hostile(port: int, limits) -> dict:
  p = "/v1/chat/completions"

  def body(**fields):
    return post_bytes(p, json.dumps({"messages": CHAT_MESSAGES, "max_tokens": 4, **fields},
                                    allow_nan=True).encode())

  big = json.dumps({"messages": [{"role": "user", "content": "w1 " * ((8 << 20) // 3)}]}).encode()
  just_under = json.dumps({"messages": [{"role": "user",
                                         "content": "w1 " * (limits.max_prompt_chars // 3 + 1)}],
                           "max_tokens": 4}).encode()
  return {
      "message_8mb": lambda: raw_request(port, post_bytes(p, big)),
      "prompt_chars_over_limit": lambda: raw_request(port, post_bytes(p, just_under)),
      "client_chat_template": lambda: raw_request(port, body(
          chat_template_kwargs={"chat_template": NESTED_JINJA})),
      "nan_temperature": lambda: raw_request(port, body(temperature=float("nan"))),
      "nan_top_p": lambda: raw_request(port, body(top_p=float("nan"))),
      "inf_temperature": lambda: raw_request(port, body(temperature=float("inf"))),
      "negative_max_tokens": lambda: raw_request(port, body(max_tokens=-1)),
      "huge_max_tokens": lambda: raw_request(port, body(max_tokens=10**30)),
      "int_4300_digits": lambda: raw_request(port, post_bytes(
          p, b'{"messages": [], "n": ' + b"9" * 4300 + b"}")),
      "lone_surrogate": lambda: raw_request(port, post_bytes(
          p, b'{"messages": [{"role": "user", "content": "\\udc00"}]}')),
      "deep_nesting": lambda: raw_request(port, post_bytes(
          p, b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}")),
      "wrong_types": lambda: raw_request(port, body(n="4", stop=[1])),
      "bad_json": lambda: raw_request(port, post_bytes(p, b"{not json")),
      "long_request": lambda: raw_request(port, post_bytes(p, json.dumps(
          {"messages": [{"role": "user", "content": "w5 " * 20}],
           "max_tokens": min(40, limits.max_tokens)}).encode()), timeout=120),
  }


def good_load(url_host: int, path: str, bodies: list[bytes], n: int, concurrency: int,
              deadline: float, until: threading.Event | None = None) -> dict:
  """`n` good requests from `concurrency` threads until `deadline` (or `until` is set); ->
  statuses, latencies."""
  lock = threading.Lock()
  statuses: collections.Counter = collections.Counter()
  latencies: list[float] = []
  counter = iter(range(n))

  def worker():
    while time.monotonic() < deadline and not (until and until.is_set()):
      with lock:
        i = next(counter, None)
      if i is None:
        return
      start = time.perf_counter()
      try:
        conn = http.client.HTTPConnection("127.0.0.1", url_host, timeout=120)
        conn.request("POST", path, body=bodies[i % len(bodies)],
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
        conn.close()
      except (OSError, http.client.HTTPException):
        status = "no_answer"
      with lock:
        statuses[status] += 1
        if status == 200:
          latencies.append(time.perf_counter() - start)

  threads = [threading.Thread(target=worker) for _ in range(concurrency)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  lat = np.asarray(latencies) * 1000
  return {"tried": sum(statuses.values()), "statuses": dict(statuses),
          "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
          "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
          "max_ms": float(lat.max()) if len(lat) else None}


def status_class(status) -> str:
  return f"{status // 100}xx" if isinstance(status, int) else str(status)


def attack(port: int, cases: dict, stop: threading.Event, threads: int, slow_clients: int,
           flood_every_s: float, flood_n: int) -> dict:
  """Hostile clients until `stop`: `threads` cycling through `cases`, `slow_clients` slowloris
  connections renewed as they are cut, and a connection flood every `flood_every_s`."""
  lock = threading.Lock()
  by_case: dict = collections.defaultdict(collections.Counter)
  floods: list = []
  names = sorted(cases)

  def hostile(k):
    i = k
    while not stop.is_set():
      name = names[i % len(names)]
      i += threads
      status = cases[name]()
      with lock:
        by_case[name][str(status)] += 1

  def slow():
    while not stop.is_set():
      outcome = slowloris(port, stop)
      with lock:
        by_case["slowloris"][outcome] += 1

  def flooder():  # at once, then every flood_every_s
    while not stop.is_set():
      result = flood(port, flood_n)
      with lock:
        floods.append(result)
      stop.wait(flood_every_s)

  workers = [threading.Thread(target=hostile, args=(k,), daemon=True) for k in range(threads)]
  workers += [threading.Thread(target=slow, daemon=True) for _ in range(slow_clients)]
  workers += [threading.Thread(target=flooder, daemon=True)] if flood_every_s else []
  for t in workers:
    t.start()
  return {"threads": workers, "by_case": by_case, "floods": floods}


def hang_up(port: int, path: str, body: bytes, stream: bool, after_s: float = 0.3) -> str:
  """One request whose client leaves: a stream once its answer has begun, else after `after_s`.
  -> 'dropped', or the status of an answer that came first (503 at the cap), or 'closed'."""
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
      s.sendall(post_bytes(path, body))
      s.settimeout(60 if stream else after_s)
      try:
        head = s.recv(64)
      except socket.timeout:
        head = b""
  except OSError:
    return "closed"
  status = head[9:12].decode("latin-1")
  return "dropped" if not head or (stream and status == "200") else status or "closed"


def idle(srv, quiet_s: float = 1.0, timeout_s: float = 900.0) -> bool:
  """Waits until no request is being handled, nothing is queued and no sampler call has run
  for `quiet_s`; False if that did not happen within `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    calls = srv.batcher.calls
    if not srv.open_connections and not srv.batcher.qsize():
      time.sleep(quiet_s)
      if srv.batcher.calls == calls and not srv.open_connections:
        return True
    time.sleep(0.05)
  return False


DROPPERS = 20  # client threads that send the dropped requests, one after another each


def dropped_phase(srv, path: str, bodies: list[bytes], limits, args) -> dict:
  """`args["dropped"]` clients that hang up (see the module docstring) while good clients keep
  sending until the last has hung up."""
  port, k = srv.server_address[1], args["dropped"]
  drop = [json.dumps({"messages": CHAT_MESSAGES, "max_tokens": limits.max_tokens,
                      "n": limits.max_n, "temperature": 1.0, "stream": stream}).encode()
          for stream in (False, True)]
  warm = good_load(port, path, drop[:1], 1, 1, time.monotonic() + 600)  # compiles those shapes
  if not idle(srv):
    return {"error": "the server did not become idle after the warm-up"}
  counts = lambda: {"refused": srv.refused, "errors": srv.errors, "calls": srv.batcher.calls,
                    "hung_up": getattr(srv, "hung_up", None),
                    "dropped": getattr(srv.batcher, "dropped", None)}
  before, compiles, threads_before = counts(), dict(COMPILES), threading.active_count()
  peak, stop, outcomes = [threads_before], threading.Event(), collections.Counter()
  lock = threading.Lock()

  def watch_threads():
    while not stop.wait(0.05):
      peak[0] = max(peak[0], threading.active_count())

  def dropper(j):
    for i in range(j, k, DROPPERS):
      outcome = hang_up(port, path, drop[i % 2], stream=i % 2 == 1)
      with lock:
        outcomes[outcome] += 1

  good: dict = {}
  workers = [threading.Thread(target=watch_threads, daemon=True), threading.Thread(
      target=lambda: good.update(good_load(port, path, bodies, 10**6, args["concurrency"],
                                           time.monotonic() + 3600, until=stop)))]
  droppers = [threading.Thread(target=dropper, args=(j,)) for j in range(DROPPERS)]
  start = time.monotonic()
  for t in workers + droppers:
    t.start()
  for t in droppers:
    t.join()
  cpu, last = time.process_time(), time.monotonic()
  stop.set()
  for t in workers:
    t.join()
  settled = idle(srv)
  after = counts()
  result = {"dropped": k, "outcomes": dict(outcomes), "good": good, "warmup": warm,
            "drops_s": round(last - start, 2), "settled": settled,
            "cpu_s_after_drops": round(time.process_time() - cpu, 2),
            "idle_after_s": round(time.monotonic() - last, 2),
            "threads": {"before": threads_before, "peak": peak[0],
                        "after": threading.active_count()},
            "refused_503": after["refused"] - before["refused"],
            "good_503": good["statuses"].get(503, 0),
            "sampler_calls_after_warmup": after["calls"] - before["calls"],
            "xla_compiles": compiles_since(compiles)}
  for name in ("hung_up", "dropped"):
    if after[name] is not None:
      result[f"server_{name}"] = after[name] - before[name]
  result["good_failures"] = good["tried"] - good["statuses"].get(200, 0)
  return result


COMPILES = {"count": 0, "seconds": 0.0}  # XLA compiles (a new sampler shape), all phases


def _count_compiles():
  import jax.monitoring

  def listener(event, seconds, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      COMPILES["count"] += 1
      COMPILES["seconds"] += seconds

  jax.monitoring.register_event_duration_secs_listener(listener)


def compiles_since(before: dict) -> dict:
  return {"count": COMPILES["count"] - before["count"],
          "seconds": round(COMPILES["seconds"] - before["seconds"], 2)}


def run_server(kind: str, args) -> dict:
  from apex_jax.tools.server import running

  logged = collections.Counter()

  class Count(logging.Handler):
    def emit(self, record):
      logged[record.levelname] += 1
      logged["traceback"] += record.exc_info is not None

  handler = Count(level=logging.DEBUG)
  for name in ("morse_jax.serving.http", "morse_jax.serving.intake", "apex_jax.tools.server",
               "apex_jax.judges.serving"):
    logging.getLogger(name).addHandler(handler)
    logging.getLogger(name).setLevel(logging.INFO)

  tmp = tempfile.TemporaryDirectory()
  if kind == "search":
    from apex_jax.tools import index, server

    corpus = os.path.join(tmp.name, "c.jsonl")
    with open(corpus, "w") as f:
      for i in range(200):
        f.write(json.dumps({"id": str(i), "contents": f'"t{i}"\nw{i % 90} w{(i * 7) % 90}'})
                + "\n")
    index.build_index(corpus, os.path.join(tmp.name, "idx"), HashEncoder(), log=lambda _: None)
    retriever = index.Retriever(os.path.join(tmp.name, "idx"), HashEncoder())
    limits = server.SearchLimits(read_timeout_s=args["read_timeout_s"])
    srv = server.make_server(retriever, "127.0.0.1", 0, limits=limits)
    path, bodies = "/retrieve", [json.dumps(b).encode() for b in SEARCH_GOOD]
  else:
    import jax

    from apex_jax.judges import InProcessChat, serving
    from apex_jax.judges.protocol import ChatLimits
    from morse_jax import llm
    from morse_jax.llm.tokenizer import Tokenizer
    from tests import tiny_models

    config = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                           num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)
    params = llm.init_random(config, jax.random.PRNGKey(0), scale=0.3)
    model = llm.Model(config, params, Tokenizer(tiny_models.make_tokenizer(), "tiny"),
                      stop_ids=(1,))
    limits = ChatLimits(read_timeout_s=args["read_timeout_s"], max_tokens=128, chunk_tokens=16,
                        max_prompt_chars=4096, max_batch=8)
    srv = serving.make_server(InProcessChat(model, max_context=256), "tiny", port=0,
                              default_max_tokens=8, limits=limits)
    path = "/v1/chat/completions"
    bodies = [json.dumps({"messages": CHAT_MESSAGES, "max_tokens": 8, "temperature": t}).encode()
              for t in (0.0, 0.7)]
  port = srv.server_address[1]
  cases = (search_hostile if kind == "search" else chat_hostile)(port, limits)
  out: dict = {"server": kind, "limits": {k: getattr(limits, k) for k in
                                          limits.__dataclass_fields__}}
  with running(srv):
    n, seconds, conc = args["requests"], args["seconds"], args["concurrency"]
    # warm-up: one unmeasured attack phase, so that the sampler shapes (rows, prompt and
    # generation buckets) that merged and chunked requests reach are compiled before measuring
    stop = threading.Event()
    hostile = attack(port, cases, stop, args["hostile_threads"] if args["attack_rounds"] else 0,
                     0, 0, 0)
    out["warmup"] = good_load(port, path, bodies, n, conc, time.monotonic() + seconds)
    stop.set()
    for t in hostile["threads"]:
      t.join(timeout=150)
    out["rss_before_mb"] = rss_mb()
    out["baseline_rounds"] = []
    for _ in range(max(1, args["attack_rounds"])):  # as many rounds as the attack
      before = dict(COMPILES)
      result = good_load(port, path, bodies, n, conc, time.monotonic() + seconds)
      result["xla_compiles"] = compiles_since(before)
      out["baseline_rounds"].append(result)
    out["baseline"] = out["baseline_rounds"][-1]
    peak = [rss_mb()]
    by_case: dict = collections.defaultdict(collections.Counter)
    floods: list = []
    out["attack_rounds"] = []
    for _ in range(args["attack_rounds"]):  # the last is `attack`; earlier ones compile shapes
      before = dict(COMPILES)
      stop = threading.Event()

      def sample_rss():
        while not stop.wait(0.05):
          peak[0] = max(peak[0], rss_mb())

      sampler = threading.Thread(target=sample_rss, daemon=True)
      sampler.start()
      hostile = attack(port, cases, stop, args["hostile_threads"], args["slow_clients"],
                       # the first flood is over (0.3 s) before good clients start
                       flood_every_s=max(2.0, limits.read_timeout_s + 1.5),
                       flood_n=limits.max_connections + 16)
      time.sleep(limits.read_timeout_s + 0.5)  # slowloris clients cut once before measuring
      start = time.monotonic()
      result = good_load(port, path, bodies, n, conc, start + seconds)
      result["seconds"] = time.monotonic() - start
      result["xla_compiles"] = compiles_since(before)
      stop.set()
      for t in hostile["threads"]:
        t.join(timeout=150)
      sampler.join()
      out["attack_rounds"].append(result)
      for name, c in hostile["by_case"].items():
        by_case[name].update(c)
      floods += hostile["floods"]
    out["attack"] = out["attack_rounds"][-1] if out["attack_rounds"] else None
    out["slow_bodies"] = {str(k): slow_body_phase(port, path, bodies, k, args)
                          for k in args["slow_sockets"]}
    if args["dropped"] and kind == "chat":
      out["dropped_clients"] = dropped_phase(srv, path, bodies, limits, args)
    out["hostile"] = {name: dict(c) for name, c in sorted(by_case.items())}
    out["hostile_by_class"] = dict(sum((collections.Counter(
        {status_class(int(k)) if k.isdigit() else k: v for k, v in c.items()})
        for c in by_case.values()), collections.Counter()))
    out["hostile_tried"] = sum(sum(c.values()) for c in out["hostile"].values())
    out["floods"] = {"count": len(floods), "opened": sum(f["opened"] for f in floods),
                     "answered": dict(sum((collections.Counter(f["answered"]) for f in floods),
                                          collections.Counter()))}
    try:
      conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
      conn.request("GET", "/health")
      health = conn.getresponse().status
      conn.close()
    except OSError:
      health = "no_answer"
    out["health_after"] = health
    out["peak_rss_attack_mb"] = peak[0]
    out["server_counts"] = {"requests": srv.requests, "errors": srv.errors,
                            "refused": srv.refused, "timeouts": srv.timeouts,
                            "evicted": srv.evicted}
  out["shutdown_clean"] = not srv.batcher._thread.is_alive()
  out["log_lines"] = dict(logged)
  good = [*out["baseline_rounds"], *out["attack_rounds"]]
  out["crashes"] = (sum(g["statuses"].get("no_answer", 0) + g["statuses"].get(500, 0)
                        for g in good) + (health != 200) + (not out["shutdown_clean"])
                    + out["log_lines"].get("traceback", 0))
  # every good request sent while slow-body sockets hold must be answered 200
  out["slow_body_failures"] = sum(r["tried"] - r["statuses"].get(200, 0)
                                  for r in out["slow_bodies"].values())
  out["good_by_class"] = {phase: dict(collections.Counter(
      {status_class(s): c for s, c in out[phase]["statuses"].items()}))
      for phase in ("baseline", "attack") if out[phase]}
  # every good request sent while clients drop theirs must be answered 200
  out["dropped_failures"] = out.get("dropped_clients", {}).get("good_failures", 0)
  for name in ("morse_jax.serving.http", "morse_jax.serving.intake", "apex_jax.tools.server",
               "apex_jax.judges.serving"):
    logging.getLogger(name).removeHandler(handler)
  tmp.cleanup()
  return out


def _ms(value) -> str:
  return "-" if value is None else f"{value:.0f} ms"  # None: no good request answered 200


def run(servers=("search", "chat"), requests: int = 200, seconds: float = 60.0,
        concurrency: int = 8, hostile_threads: int = 4, slow_clients: int = 8,
        read_timeout_s: float = 2.0, attack_rounds: int = 1, slow_sockets=(80, 400),
        out: str | None = None, dropped: int = 100) -> dict:
  args = dict(requests=requests, seconds=seconds, concurrency=concurrency,
              hostile_threads=hostile_threads, slow_clients=slow_clients,
              read_timeout_s=read_timeout_s, attack_rounds=attack_rounds,
              slow_sockets=tuple(slow_sockets), dropped=dropped)
  # both ends of every slow socket live in this process, plus the hostile and good clients
  fd_limit = raise_fd_limit(2 * max(slow_sockets, default=0) + 1024)
  report = {"args": args, "fd_limit": fd_limit, "servers": {}}
  _count_compiles()
  for kind in servers:
    r = run_server(kind, args)
    report["servers"][kind] = r
    b, a = r["baseline"], r["attack"]
    if a:
      print(f"{kind}: good {b['tried']} + {a['tried']} (baseline {r['good_by_class']['baseline']}"
            f", attack {r['good_by_class']['attack']}), hostile {r['hostile_tried']}, crashes "
            f"{r['crashes']}, p99 {_ms(b['p99_ms'])} -> {_ms(a['p99_ms'])} under attack "
            f"({a['xla_compiles']['count']} XLA compiles, {a['xla_compiles']['seconds']} s), "
            f"peak RSS {r['peak_rss_attack_mb']:.0f} MB", flush=True)
    for k, sb in r["slow_bodies"].items():
      print(f"{kind}: {k} slow-body sockets ({sb['opened']} opened): good "
            f"{sb['statuses']}, success {sb['success_rate']:.0%}, p50 {_ms(sb['p50_ms'])}, "
            f"p99 {_ms(sb['p99_ms'])}", flush=True)
    d = r.get("dropped_clients")
    if d and "good" in d:
      print(f"{kind}: {d['dropped']} dropped clients ({d['outcomes']}) in {d['drops_s']} s: good "
            f"{d['good']['statuses']}, p99 {_ms(d['good']['p99_ms'])}; threads {d['threads']}; "
            f"503s: {d['good_503']} good, {d['refused_503']} refused at the cap; "
            f"{d['cpu_s_after_drops']} CPU s and {d['idle_after_s']} s until idle after the last "
            f"hang-up; hung up {d.get('server_hung_up')}, jobs dropped "
            f"{d.get('server_dropped')}", flush=True)
    elif d:
      print(f"{kind}: dropped clients: {d}", flush=True)
  report["crashes"] = sum(r["crashes"] for r in report["servers"].values())
  report["slow_body_failures"] = sum(r["slow_body_failures"] for r in report["servers"].values())
  report["dropped_failures"] = sum(r["dropped_failures"] for r in report["servers"].values())
  report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  if out:
    from benchmarks.common import write_report

    write_report("server_fuzz", out, **report)
  return report


def main(argv):
  del argv
  from absl import flags

  f = flags.FLAGS
  report = run(tuple(f.servers), f.requests, f.seconds, f.concurrency, f.hostile_threads,
               f.slow_clients, f.read_timeout_s, f.attack_rounds,
               [int(k) for k in f.slow_sockets], f.out or None, f.dropped)
  if report["crashes"] or report["slow_body_failures"] or report["dropped_failures"]:
    raise SystemExit(f"{report['crashes']} crashes, {report['slow_body_failures']} good requests "
                     f"not answered 200 under slow-body sockets, {report['dropped_failures']} "
                     f"while clients dropped theirs")


if __name__ == "__main__":
  from absl import app, flags

  flags.DEFINE_list("servers", ["search", "chat"], "Which servers: search, chat.")
  flags.DEFINE_integer("requests", 200, "Good requests per phase (baseline, attack).")
  flags.DEFINE_float("seconds", 60.0, "Longest time per phase.")
  flags.DEFINE_integer("concurrency", 8, "Good clients at once.")
  flags.DEFINE_integer("hostile_threads", 4, "Hostile clients cycling through the cases.")
  flags.DEFINE_integer("slow_clients", 8, "Slowloris connections held at once.")
  flags.DEFINE_float("read_timeout_s", 2.0, "The servers' read deadline (short for the run).")
  flags.DEFINE_integer("attack_rounds", 1, "Attack phases; the last is reported as `attack` "
                       "(earlier ones compile the sampler shapes merged requests reach).")
  flags.DEFINE_list("slow_sockets", ["80", "400"], "Slow-body attacks: sockets held at once "
                    "(each sends headers and 1 of 100 body bytes, reopened when cut).")
  flags.DEFINE_integer("dropped", 100, "Chat requests whose clients hang up (0: no such phase).")
  flags.DEFINE_string("out", "benchmarks/results/server_fuzz.json", "JSON report ('' for none).")
  app.run(main)
