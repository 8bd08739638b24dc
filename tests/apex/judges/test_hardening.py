"""The chat server against hostile clients: every bad field a 400 naming field and value (NaN,
infinities, negatives, huge numbers, lone surrogates, nesting, wrong types), client chat
templates refused, the prompt bounded before any tokenizing, long requests taking turns with
short ones (chunked generation), a bad request never failing the requests merged with it, jobs
of clients gone never run again, `seed` reproducible whatever is merged with it, a full queue
answered 503, and SIGTERM during generation: the request answered, exit 0."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from apex_jax.judges import InProcessChat, serving
from apex_jax.judges.inprocess import Completion
from apex_jax.judges.protocol import ChatLimits, ChatRequest, parse_chat_request
from apex_jax.tools.server import running
from tests import test_configs
from tests.apex.judges.test_server import MSG, model, post  # noqa: F401 -- a fixture
from tests.apex.tools.test_server import wait_until

LIMITS = ChatLimits(max_body_bytes=16384, max_prompt_chars=300, max_messages=4, max_tokens=32,
                    max_n=4, chunk_tokens=4, max_queue=4)


def served(model, engine: bool):  # noqa: F811
  srv = serving.make_server(InProcessChat(model, max_context=64), "tiny", port=0,
                            default_max_tokens=8, limits=LIMITS, engine=engine)
  with running(srv):
    yield srv


@pytest.fixture(scope="module")
def server(model):  # noqa: F811
  """On the engine (what `launchers.serve` builds on one device)."""
  yield from served(model, True)


@pytest.fixture(scope="module")
def merged(model):  # noqa: F811
  """On merged sampler calls in turns (`ChatBatcher`): for the tests that watch them."""
  yield from served(model, False)


def raw_post(srv, data: bytes):
  return post(srv, None, raw=data)


NAN, INF = float("nan"), float("inf")
BAD = [
    ({"temperature": NAN}, "temperature", "finite number, got float NaN"),
    ({"top_p": NAN}, "top_p", "finite number, got float NaN"),
    ({"temperature": INF}, "temperature", "finite number, got float Infinity"),
    ({"top_p": -INF}, "top_p", "finite number, got float -Infinity"),
    ({"temperature": -0.5}, "temperature", "got -0.5"),
    ({"temperature": 1e300}, "temperature", "got 1e\\+300"),
    ({"max_tokens": -1}, "max_tokens", "must be in \\[1, 32\\], got -1"),
    ({"max_tokens": 10**30}, "max_tokens", "got 1000000000000000000000000000000"),
    ({"max_tokens": 33}, "max_tokens", "got 33"),
    ({"max_tokens": NAN}, "max_tokens", "must be an integer, got float NaN"),
    ({"n": 5}, "n", "got 5"),
    ({"n": [1]}, "n", "must be an integer, got list"),
    ({"stop": "\ud800"}, "stop", "stop\\[0\\] is not valid Unicode: lone surrogate U\\+D800"),
    ({"stop": ["x" * 300]}, "stop", "300 characters"),
    ({"model": "a\udfff"}, "model", "lone surrogate U\\+DFFF"),
    ({"model": 5}, "model", "must be a string"),
    ({"messages": [{"role": "user", "content": "ok \udc00"}]}, "messages",
     "messages\\[0\\].content is not valid Unicode: lone surrogate U\\+DC00 at index 3"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud801"}]}]},
     "messages", "content\\[0\\].text is not valid Unicode"),
    ({"messages": [{"role": "user", "content": "w1 " * 101}]}, "messages",
     "more than 300 characters"),
    ({"messages": MSG * 5}, "messages", "5 messages; at most 4"),
    ({"chat_template_kwargs": {"chat_template": "{% for a in range(9999) %}x{% endfor %}"}},
     "chat_template_kwargs", "chat_template_kwargs.chat_template' refused: a client's chat "
     "template is not accepted"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs",
     "argument of the template call"),
    ({"chat_template_kwargs": {"x": {"deep": 1}}}, "chat_template_kwargs",
     "chat_template_kwargs.x' must be null, a boolean"),
    ({"chat_template_kwargs": {"x": NAN}}, "chat_template_kwargs", "got float NaN"),
    ({"chat_template_kwargs": {"x": "v" * 300}}, "chat_template_kwargs", "256 characters"),
    ({"chat_template_kwargs": {"not an id": 1}}, "chat_template_kwargs", "identifier"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs", "must be an object"),
    ({"chat_template": "{% for a in range(9999) %}x{% endfor %}"}, "chat_template",
     "field 'chat_template' refused: a client's chat template is not accepted"),
    ({"response_format": {"type": "json_object"}}, "response_format",
     "not supported by this server \\(accepted: null or {\"type\": \"text\"}\\)"),
    ({"tools": [{"type": "function"}]}, "tools", "'tools' is not supported"),
    ({"tool_choice": "auto"}, "tool_choice", "accepted: null or \"none\""),
    ({"logprobs": True}, "logprobs", "accepted: null or false"),
    ({"presence_penalty": 0.5}, "presence_penalty", "got float 0.5"),
    ({"seed": True}, "seed", "must be an integer, got bool true"),
    ({"seed": 1.0}, "seed", "must be an integer, got float 1.0"),
    ({"seed": "7"}, "seed", 'must be an integer, got str "7"'),
    ({"seed": 2**63}, "seed", "must be in \\[-9223372036854775808, 9223372036854775807\\], got "
                              "9223372036854775808"),
    ({"seed": -2**63 - 1}, "seed", "got -9223372036854775809"),
    ({"top_k": 5}, "top_k", "unknown field 'top_k' for /v1/chat/completions"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options", "include_usage"),
]


@pytest.mark.parametrize("fields,param,match", BAD)
def test_bad_fields_are_400_naming_field_and_value(server, fields, param, match):
  body = json.dumps({"messages": MSG, "max_tokens": 4, **fields}, allow_nan=True).encode()
  status, out = raw_post(server, body)
  assert status == 400 and out["error"]["param"] == param, out
  assert re.search(match, out["error"]["message"]), out


@pytest.mark.parametrize("body,match", [
    (b'{"messages": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nested too deep"),
    (b'{"messages": [{"role": "user", "content": [[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]}]}',
     "nested more than 16 levels"),
    (b'{"messages": [], "n": ' + b"9" * 4300 + b"}", "4300 digits; at most 64"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"{not json", "invalid JSON")])
def test_malformed_bodies_are_400_for_the_body(server, body, match):
  status, out = raw_post(server, body)
  assert status == 400 and out["error"]["param"] == "body" and match in out["error"]["message"]


def test_oversized_body_is_413_and_long_prompts_are_refused_before_tokenizing(server):
  status, out = raw_post(server, json.dumps({"messages": [{"role": "user",
                                                           "content": "w1 " * 8000}]}).encode())
  assert status == 413 and "at most 16384" in out["error"]["message"]
  calls = []
  real = server.chat.prompt_tokens
  server.chat.prompt_tokens = lambda *a, **k: calls.append(1) or real(*a, **k)
  try:
    status, out = post(server, {"messages": [{"role": "user", "content": "w1 " * 150}]})
  finally:
    del server.chat.prompt_tokens
  assert status == 400 and "more than 300 characters" in out["error"]["message"]
  assert calls == []  # refused on its characters: never tokenized
  status, out = post(server, {"messages": [{"role": "user", "content": "w1 " * 60}],
                              "max_tokens": 8})
  assert status == 400 and "exceeds the context of 64" in out["error"]["message"]


def test_template_variables_are_accepted(server):
  status, out = post(server, {"messages": MSG, "max_tokens": 4, "n": 4, "temperature": 0,
                              "chat_template_kwargs": {"enable_thinking": False}})
  assert status == 200, out


def test_limits_are_checked_when_the_server_is_made(model):  # noqa: F811
  with pytest.raises(ValueError, match="default_max_tokens must be in \\[1, 32\\]"):
    serving.make_server(InProcessChat(model), "tiny", port=0, default_max_tokens=64,
                        limits=LIMITS)
  with pytest.raises(ValueError, match="chunk_tokens must be a positive number"):
    ChatLimits(chunk_tokens=0)
  req = parse_chat_request(json.dumps({"messages": MSG}).encode(), 8)
  assert req.max_tokens == 8 and req.n == 1


def test_chunked_turns_give_the_same_greedy_text(merged):
  """With chunk_tokens=4, 8 new tokens take two turns (the second re-reads prompt + 4 tokens);
  greedy text equals one uninterrupted call."""
  server = merged
  calls, requeued = server.batcher.calls, server.batcher.requeued
  status, out = post(server, {"messages": MSG, "max_tokens": 8, "temperature": 0.0, "n": 4})
  assert status == 200
  prompt = server.chat.prompt_tokens(MSG)
  direct = server.chat.generate([prompt] * 4, [8] * 4, temperature=0.0)
  assert [c["message"]["content"] for c in out["choices"]] == [c.text for c in direct]
  assert out["usage"]["completion_tokens"] == sum(c.completion_tokens for c in direct)
  if all(c.completion_tokens == 8 for c in direct):  # no early EOS: two turns
    assert server.batcher.calls - calls == 2 and server.batcher.requeued - requeued == 1


class FakeChat:
  """generate: `limit` tokens per row (token 5), recording each call's rows; can fail on a
  prompt holding token 99 when merged with others, wait for `gate` on the first call, and run
  `hold(call_number)` at the start of every call."""

  def __init__(self, hold=lambda n: None):
    self.calls, self.gate, self.hold = [], threading.Event(), hold

  def generate(self, prompts, limits, *, temperature, top_p=1.0, stops=None, keys=None):
    self.calls.append([(p[0], n) for p, n in zip(prompts, limits)])
    self.hold(len(self.calls))
    if len(self.calls) == 1:
      self.gate.wait(timeout=30)
    if any(99 in p for p in prompts):
      raise RuntimeError("device lost on 99")
    return [Completion("", "length", len(p), n, (5,) * n) for p, n in zip(prompts, limits)]

  def completion(self, ids, prompt_len, stop):
    return Completion("w" * len(ids), "length", prompt_len, len(ids), tuple(ids))


def submit_later(batcher, prompt, max_tokens, out, key, done_order):
  req = ChatRequest(messages=MSG, max_tokens=max_tokens)

  def go():
    try:
      out[key] = batcher.submit(prompt, req)
    except Exception as e:  # noqa: BLE001 -- checked by the test
      out[key] = e
    done_order.append(key)
  t = threading.Thread(target=go)
  t.start()
  return t


def test_a_long_request_takes_turns_with_short_ones():
  """A 12-token request in turns of 2: a short request that arrives during its first turn is
  merged into its second turn and answered then, not after the long one ends."""
  out, order = {}, []

  def hold(call):  # the long one's turn 3 waits (bounded) for the short one's thread to finish,
    if call == 3:  # which it can only if the batcher answered the short one in turn 2
      deadline = time.monotonic() + 10
      while "short" not in order and time.monotonic() < deadline:
        time.sleep(0.01)
  chat = FakeChat(hold)
  batcher = serving.ChatBatcher(chat, max_batch=8, chunk_tokens=2)
  long = submit_later(batcher, [1], 12, out, "long", order)
  wait_until(lambda: chat.calls)
  short = submit_later(batcher, [2], 2, out, "short", order)
  wait_until(lambda: batcher.qsize() == 1)
  chat.gate.set()
  long.join(timeout=30)
  short.join(timeout=30)
  batcher.close()
  assert order == ["short", "long"]
  assert chat.calls[:2] == [[(1, 2)], [(2, 2), (1, 2)]]  # the short one in the long one's turn 2
  assert len(chat.calls) == 6 and [c.completion_tokens for c in out["long"]] == [12]
  assert batcher.requeued == 5


def test_a_failing_request_never_fails_the_ones_merged_with_it():
  chat = FakeChat()
  batcher = serving.ChatBatcher(chat, max_batch=8, chunk_tokens=8)
  out, order = {}, []
  first = submit_later(batcher, [1], 2, out, "first", order)
  wait_until(lambda: chat.calls)
  rest = [submit_later(batcher, p, 2, out, k, order)
          for p, k in (([3], "good1"), ([99], "bad"), ([4], "good2"))]
  wait_until(lambda: batcher.qsize() == 3)
  chat.gate.set()
  for t in [first, *rest]:
    t.join(timeout=30)
  batcher.close()
  assert [len(out[k]) for k in ("first", "good1", "good2")] == [1, 1, 1]
  assert isinstance(out["bad"], RuntimeError) and batcher.isolated == 1


def test_a_cancelled_job_never_runs_again():
  """Jobs cancelled (their clients gone) while queued, and after their round grouped them but
  before their sampler call, never reach the sampler; the one still wanted runs to its end."""
  jobs = {}

  def hold(call):  # the first call of round 2 is `other`'s; `later` waits for the second
    if call == 2:
      jobs["later"].cancel()
  chat = FakeChat(hold)
  batcher = serving.ChatBatcher(chat, max_batch=8, chunk_tokens=2)
  req = lambda temperature, max_tokens=4: ChatRequest(messages=MSG, max_tokens=max_tokens,
                                                      temperature=temperature)
  first = batcher.start([1], req(1.0))  # 2 turns
  wait_until(lambda: chat.calls)
  jobs["queued"] = batcher.start([2], req(1.0))
  other = batcher.start([3], req(0.0, 2))
  jobs["later"] = batcher.start([4], req(1.0))
  jobs["queued"].cancel()
  chat.gate.set()
  assert len(first.result(timeout=30)) == len(other.result(timeout=30)) == 1
  batcher.close()
  assert chat.calls == [[(1, 2)], [(3, 2)], [(1, 2)]]  # neither 2 nor 4 ever ran
  assert batcher.dropped == 2


def test_a_full_queue_drops_cancelled_jobs_to_make_room():
  chat = FakeChat()
  batcher = serving.ChatBatcher(chat, max_batch=8, chunk_tokens=2, max_queue=1)
  req = ChatRequest(messages=MSG, max_tokens=2)
  first = batcher.start([1], req)
  wait_until(lambda: chat.calls)
  batcher.start([2], req).cancel()  # its client left while it waited
  third = batcher.start([3], req)  # before: 503, the queue held the cancelled one
  chat.gate.set()
  assert len(first.result(timeout=30)) == len(third.result(timeout=30)) == 1
  batcher.close()
  assert chat.calls == [[(1, 2)], [(3, 2)]] and batcher.dropped == 1


def test_a_seed_gives_the_same_samples_whatever_is_merged_with_it(merged):
  """seed: the n rows differ from each other, the same seed repeats them (over two turns of 4
  tokens), also merged behind another request in one sampler call; another seed differs."""
  server = merged
  body = {"messages": MSG, "max_tokens": 8, "temperature": 1.0, "n": 4, "seed": 7}
  texts = lambda reply: [c["message"]["content"] for c in reply[1]["choices"]]
  alone = texts(post(server, body))
  assert len(set(alone)) > 1
  assert texts(post(server, body)) == alone
  assert texts(post(server, {**body, "seed": 8})) != alone
  chat, release, calls = server.chat, threading.Event(), []
  real = chat.generate

  def gated(prompts, *args, **kwargs):  # holds the first call until two more requests queue
    calls.append(len(prompts))
    if len(calls) == 1:
      release.wait(timeout=120)
    return real(prompts, *args, **kwargs)

  chat.generate = gated
  results = {}
  ask = lambda key, b: threading.Thread(target=lambda: results.__setitem__(key, post(server, b)))
  threads = [ask("gate", {"messages": MSG, "max_tokens": 4, "temperature": 0.0, "n": 4}),
             ask("other", {"messages": [{"role": "user", "content": "w5 w6 w7 w8 w9"}],
                           "max_tokens": 4, "temperature": 1.0}),
             ask("seeded", body)]
  try:
    threads[0].start()
    wait_until(lambda: calls)
    for t in threads[1:]:
      t.start()
      wait_until(lambda: server.batcher.qsize() == threads.index(t))
    release.set()
    for t in threads:
      t.join(timeout=300)
  finally:
    del chat.generate
  assert calls[:2] == [4, 5]  # the seeded rows behind another request's, in one call
  assert texts(results["seeded"]) == alone


def test_seeded_completions_and_unseeded_rows_beside_seeded_ones(server):
  """/v1/completions: each choice has its own key (two equal prompts, four different rows,
  repeated with the seed). A row without a key draws what it would without any keyed row."""
  from apex_jax.judges.inprocess import seeded_keys

  body = {"prompt": ["w1 w2", "w1 w2"], "max_tokens": 4, "temperature": 1.0, "n": 2, "seed": 3}
  status, out = post(server, body, "/v1/completions")
  assert status == 200, out
  rows = [c["text"] for c in out["choices"]]
  assert len(set(rows)) > 1 and [c["text"] for c in post(
      server, body, "/v1/completions")[1]["choices"]] == rows
  model = server.chat.model
  prompt = server.chat.prompt_tokens(MSG)
  plain = InProcessChat(model, seed=5).generate([prompt] * 4, [4] * 4, temperature=1.0)
  keys = [None, *seeded_keys(1, 0, 2), None]
  mixed = InProcessChat(model, seed=5).generate([prompt] * 4, [4] * 4, temperature=1.0, keys=keys)
  assert [mixed[i].token_ids for i in (0, 3)] == [plain[i].token_ids for i in (0, 3)]
  assert seeded_keys(1, 0, 1).tolist() != seeded_keys(2**32 + 1, 0, 1).tolist()  # both halves


def test_full_queue_is_503(model):  # noqa: F811
  chat = InProcessChat(model, max_context=64)
  gate, calls = threading.Event(), []
  real = chat.generate

  def gated(*a, **k):
    calls.append(1)
    gate.wait(timeout=60)
    return real(*a, **k)

  chat.generate = gated
  limits = ChatLimits(max_queue=1, max_tokens=16)
  srv = serving.make_server(chat, "tiny", port=0, default_max_tokens=4, limits=limits,
                            engine=False)  # the gate holds a merged sampler call
  with running(srv):
    results = []
    body = {"messages": MSG, "max_tokens": 2, "n": 4, "temperature": 0}
    threads = [threading.Thread(target=lambda: results.append(post(srv, body)))]
    threads[0].start()
    wait_until(lambda: calls)
    threads.append(threading.Thread(target=lambda: results.append(post(srv, body))))
    threads[1].start()
    wait_until(lambda: srv.batcher.qsize() == 1)
    status, out = post(srv, body)
    assert status == 503 and out["error"]["type"] == "server_busy"
    assert "1 requests queued" in out["error"]["message"]
    gate.set()
    for t in threads:
      t.join(timeout=120)
  assert sorted(r[0] for r in results) == [200, 200]


@pytest.mark.slow
def test_sigterm_during_generation_answers_and_exits_0(tmp_path):
  """launchers.serve in a process of its own: SIGTERM while a long request generates (in turns
  of 4 tokens); the request is still answered 200, new connections are refused, exit 0 (no
  'Fatal Python error: Aborted')."""
  import http.client

  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONUNBUFFERED": "1"}
  proc = subprocess.Popen(
      [sys.executable, "-m", "launchers.serve", f"--model={folder}", "--port=0",
       "--dtype=float32", "--chunk_tokens=4", "--max_tokens=200", "--default_max_tokens=16",
       "--read_timeout_s=30"],
      cwd=test_configs.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  lines = []
  try:
    port = None
    deadline = time.monotonic() + 240
    while port is None and time.monotonic() < deadline:
      line = proc.stdout.readline()
      if not line:
        break
      lines.append(line)
      m = re.search(r"serving \S+ at http://127\.0\.0\.1:(\d+)/v1", line)
      port = int(m.group(1)) if m else None
    assert port, "".join(lines)[-3000:]
    result = {}

    def ask():
      conn = http.client.HTTPConnection("127.0.0.1", port, timeout=240)
      conn.request("POST", "/v1/chat/completions", body=json.dumps(
          {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 120,
           "temperature": 1.0}), headers={"Content-Type": "application/json"})
      resp = conn.getresponse()
      result["status"], result["body"] = resp.status, json.loads(resp.read())

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(3.0)  # generating (the sampler compiles, then turns of 4 tokens)
    in_flight = "status" not in result
    proc.send_signal(signal.SIGTERM)
    asker.join(timeout=240)
    rest, _ = proc.communicate(timeout=240)
    lines.append(rest)
  finally:
    if proc.poll() is None:
      proc.kill()
  text = "".join(lines)
  if not in_flight:
    pytest.skip("the request was answered before SIGTERM: nothing in flight to check")
  assert proc.returncode == 0, text[-3000:]
  assert "Fatal Python error" not in text and "Traceback" not in text, text[-3000:]
  assert result.get("status") == 200, (result, text[-2000:])
  assert result["body"]["usage"]["completion_tokens"] >= 1
  assert re.search(r"served 1 requests \(0 errors\)", text), text[-2000:]
