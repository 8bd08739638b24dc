"""The real chat server (`launchers.serve`'s) on loopback over a tiny random model: the OpenAI
shapes, protocol errors, merging of queued requests, surviving an internal error, and the
judges end to end through ChatClient (the model emits garbage: every judge must end in counted
failures with defined scores).

Every generating request here has 4 rows, a short prompt and at most 8 new tokens, so the
sampler compiles once. The judges' own prompts exceed the server's 64-token context and are
answered 400, which the judges count as `rejected`; `test_judges_generate_in_process` (slow)
runs them through real generation."""

import http.client
import json
import re
import threading

import jax
import numpy as np
import pytest

from apex_jax.judges import (Candidate, ChatClient, InProcessChat, LlmJudge, NoGtConfig,
                             NoGtJudge, AlignJudge, serving)
from apex_jax.judges.inprocess import AdapterRoute
from apex_jax.tools.server import running
from morse_jax import llm
from morse_jax.lora import experts as lora_lib
from tests.apex.agents import fakes

MSG = [{"role": "user", "content": "w1 w2 w3"}]


@pytest.fixture(scope="module")
def model():
  config = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)
  params = llm.init_random(config, jax.random.PRNGKey(0), scale=0.3)
  return llm.Model(config, params, fakes.tokenizer(), stop_ids=(fakes.EOS,))


def random_route(model, seed=1):
  """A one-expert route whose B is random (at init B = 0 would equal the base model)."""
  lora = lora_lib.LoraConfig(roles=("adapter",), num_subtask_experts=0, last_n_layers=1, rank=2)
  experts = lora_lib.init_experts(lora, model.config, jax.random.PRNGKey(seed))
  experts = {t: lora_lib.ExpertWeights(e.a * 20, jax.random.normal(jax.random.PRNGKey(seed + 1),
                                                                   e.b.shape))
             for t, e in experts.items()}
  return AdapterRoute(experts, lora, (0,))


def served(model, engine: bool):
  adapters = {"exec": InProcessChat(model, random_route(model), max_context=64)}
  srv = serving.make_server(InProcessChat(model, max_context=64), "tiny", port=0, max_n=4,
                            adapters=adapters, engine=engine)
  with running(srv):
    yield srv


@pytest.fixture(scope="module")
def server(model):
  """On the engine (what `launchers.serve` builds on one device)."""
  yield from served(model, True)


@pytest.fixture(scope="module")
def merged(model):
  """On merged sampler calls (`ChatBatcher`): for the tests that watch those calls."""
  yield from served(model, False)


def post(srv, body, path="/v1/chat/completions", method="POST", raw=None):
  conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=600)
  data = raw if raw is not None else json.dumps(body).encode()
  conn.request(method, path, body=data if method == "POST" else None,
               headers={"Content-Type": "application/json"})
  resp = conn.getresponse()
  out = resp.status, json.loads(resp.read())
  conn.close()
  return out


def test_completion_shape_usage_stop_and_length(server):
  status, out = post(server, {"messages": MSG, "max_tokens": 6, "temperature": 0.0, "n": 4,
                              "model": "anything"})
  assert status == 200, out
  assert out["object"] == "chat.completion" and out["model"] == "tiny"
  assert out["id"].startswith("chatcmpl-") and isinstance(out["created"], int)
  assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
  texts = {c["message"]["content"] for c in out["choices"]}
  assert len(texts) == 1  # greedy: the 4 rows agree
  choice = out["choices"][0]
  assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
  usage = out["usage"]
  assert usage["prompt_tokens"] == len(fakes.tokenizer().apply_chat_template(MSG))
  assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
  assert 4 <= usage["completion_tokens"] <= 24
  text = choice["message"]["content"]
  if choice["finish_reason"] == "length" and len(text.split()) >= 2:  # cut at a stop string
    stop = text.split()[1]
    _, cut = post(server, {"messages": MSG, "max_tokens": 6, "temperature": 0.0, "n": 4,
                           "stop": [stop]})
    assert cut["choices"][0]["message"]["content"] == text[:text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
  _, short = post(server, {"messages": MSG, "max_tokens": 1, "temperature": 0.0, "n": 4})
  assert short["usage"]["completion_tokens"] == 4


def test_queued_requests_are_merged_into_one_sampler_call(merged):
  server = merged
  chat, release = server.chat, threading.Event()
  real = chat.generate
  calls = []

  def gated(prompts, *args, **kwargs):  # holds the first call until 3 more requests queue
    calls.append(len(prompts))
    if len(calls) == 1:
      release.wait(timeout=120)
    return real(prompts, *args, **kwargs)

  chat.generate = gated
  try:
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(
        post(server, {"messages": MSG, "max_tokens": 4, "temperature": 0.0, "n": n})))
        for n in (4, 1, 1, 2)]
    threads[0].start()
    while not calls:
      threading.Event().wait(0.01)
    for t in threads[1:]:
      t.start()
    while server.batcher.qsize() < 3:
      threading.Event().wait(0.01)
    release.set()
    for t in threads:
      t.join(timeout=600)
  finally:
    del chat.generate
  assert calls == [4, 4]  # the three queued requests (1 + 1 + 2 rows) ran together
  assert sorted(len(r[1]["choices"]) for r in results) == [1, 1, 2, 4]


@pytest.mark.parametrize("body, param, match", [
    ({}, "messages", "missing field 'messages'"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "messages\\[0\\].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages", "content must be a string"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens", "got 0"),
    ({"messages": MSG, "max_tokens": "5"}, "max_tokens", 'got str "5"'),
    ({"messages": MSG, "max_tokens": 60}, "max_tokens", "exceeds the context of 64"),
    ({"messages": MSG, "temperature": "hot"}, "temperature", 'got str "hot"'),
    ({"messages": MSG, "top_p": 0}, "top_p", "got 0"),
    ({"messages": MSG, "n": 5}, "n", "got 5"),
    ({"messages": MSG, "stop": [1]}, "stop", "list of at most 4 strings"),
    ({"messages": MSG, "stream": "yes"}, "stream", 'must be true or false, got str "yes"'),
    ({"messages": [{"role": "user", "content": "w1 " * 80}], "max_tokens": 4}, "messages",
     "exceeds the context")])
def test_bad_requests_are_400_naming_the_field(server, body, param, match):
  status, out = post(server, body)
  assert status == 400 and out["error"]["param"] == param, out
  assert out["error"]["type"] == "invalid_request_error"
  assert re.search(match, out["error"]["message"]), out


def test_protocol_errors_and_info_endpoints(server):
  assert post(server, None, raw=b"{not json")[0] == 400
  status, out = post(server, None, "/v1/embeddings")
  assert status == 404 and out["error"]["type"] == "not_found_error"
  status, out = post(server, {"prompt": 3}, "/v1/completions")
  assert status == 400 and out["error"]["param"] == "prompt", out
  assert post(server, None, "/v1/completions", "GET")[0] == 405
  assert post(server, None, "/v1/chat/completions", "GET")[0] == 405
  assert post(server, {}, "/health")[0] == 405
  assert post(server, None, "/v1/models", "DELETE")[0] == 405
  assert post(server, None, "/health", "GET") == (200, {"status": "ok", "model": "tiny"})
  status, out = post(server, None, "/v1/models", "GET")
  assert status == 200 and out["data"][0]["id"] == "tiny" and out["object"] == "list"
  assert [(m["id"], m.get("parent")) for m in out["data"]] == [("tiny", None), ("exec", "tiny")]


def test_adapter_route_serves_its_own_generation(merged):
  """"model": "exec" generates through the adapter (what InProcessChat with that route gives),
  other names through the base model; a batch of both makes one sampler call per route."""
  server = merged
  body = {"messages": MSG, "max_tokens": 8, "temperature": 0.0, "n": 4}
  calls = server.batcher.calls
  results = [None, None]
  threads = [threading.Thread(target=lambda i=i, m=m: results.__setitem__(
      i, post(server, {**body, "model": m}))) for i, m in enumerate(("exec", "qwen"))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  (s1, adapted), (s2, base) = results
  assert s1 == s2 == 200 and adapted["model"] == "exec" and base["model"] == "tiny"
  prompt = server.chat.prompt_tokens(MSG)
  direct = server.adapters["exec"].generate([prompt] * 4, [8] * 4, temperature=0.0)
  plain = server.chat.generate([prompt] * 4, [8] * 4, temperature=0.0)
  assert adapted["choices"][0]["message"]["content"] == direct[0].text
  assert base["choices"][0]["message"]["content"] == plain[0].text != direct[0].text
  assert server.batcher.calls - calls == 2
  with pytest.raises(ValueError, match="adapter 'x' must be an InProcessChat with an adapter_route"):
    serving.make_server(server.chat, "tiny", port=0, adapters={"x": server.chat})


def test_adapter_route_runs_on_its_own_engine(server):
  """On the engine: "model": "exec" generates through the adapter (an engine of its own, the
  route on each row) with the greedy text InProcessChat gives, other names through the base."""
  body = {"messages": MSG, "max_tokens": 8, "temperature": 0.0, "n": 4}
  (s1, adapted), (s2, base) = (post(server, {**body, "model": m}) for m in ("exec", "qwen"))
  assert s1 == s2 == 200 and adapted["model"] == "exec" and base["model"] == "tiny"
  prompt = server.chat.prompt_tokens(MSG)
  direct = server.adapters["exec"].generate([prompt] * 4, [8] * 4, temperature=0.0)
  plain = server.chat.generate([prompt] * 4, [8] * 4, temperature=0.0)
  assert [c["message"]["content"] for c in adapted["choices"]] == [c.text for c in direct]
  assert base["choices"][0]["message"]["content"] == plain[0].text != direct[0].text
  assert len(server.batcher.engines) == 2


def test_internal_error_is_500_and_the_server_keeps_serving(merged):
  server = merged
  def broken(*args, **kwargs):
    raise RuntimeError("device lost")
  server.chat.generate = broken
  try:
    status, out = post(server, {"messages": MSG, "max_tokens": 2, "n": 4})
  finally:
    del server.chat.generate
  assert status == 500 and "device lost" in out["error"]["message"]
  assert out["error"]["type"] == "server_error"
  assert post(server, {"messages": MSG, "max_tokens": 2, "n": 4, "temperature": 0})[0] == 200


def test_judges_end_to_end_over_http_count_failures(server):
  client = ChatClient(server.url, "tiny", retries=0)
  llm_judge = LlmJudge(client)
  j = llm_judge.judge("who? w1", "w2", "w3")
  assert (j.verdict, j.score, j.failure) == (None, 0.0, "rejected")
  nogt = NoGtJudge(client)
  out = nogt.judge_group("who?", [Candidate("w5", "w6"), Candidate("w7")])
  assert [j.reward for j in out] == [0.0, 0.0]
  assert nogt.evaluator_failures.snapshot()["rejected"] == 6
  assert nogt.arbiter_failures.snapshot()["rejected"] == 2
  align = AlignJudge(client)
  assert align.score("plan", {"procedure": ["search"], "pitfalls": []}).failure == "rejected"


@pytest.mark.slow  # ~1 min on a shared CPU: compiles the sampler for prompts of ~1k tokens
def test_judges_generate_in_process(model):
  experts = lora_lib.init_experts(lora_lib.LoraConfig(num_subtask_experts=1, last_n_layers=1,
                                                      rank=2), model.config, jax.random.PRNGKey(1))
  route = AdapterRoute(experts, lora_lib.LoraConfig(num_subtask_experts=1, last_n_layers=1,
                                                    rank=2), (0, 2))
  chat = InProcessChat(model, route)
  calls = []
  real = chat.generate
  chat.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or real(prompts, *a, **k)
  nogt = NoGtJudge(chat, NoGtConfig(evaluator_max_tokens=8, arbiter_max_tokens=8))
  out = nogt.judge_group("who? w1", [Candidate("w5", "w6"), Candidate("w7"), Candidate("w8")])
  assert calls == [9, 3]  # 3G evaluator rows in one sampler call, then G arbiter rows
  for j in out:
    assert 0.0 <= j.reward <= 1.0 and 0.0 <= j.weighted <= 1.0
  snapshot = nogt.evaluator_failures.snapshot()
  assert sum(snapshot.values()) + sum(e.failure is None for j in out
                                      for e in j.evaluators.values()) == 9
  judge = LlmJudge(chat)
  assert judge.judge("q w1", "w2", "w3").score in (0.0, 1.0)


def test_serve_launcher_reads_lora_modules(model, tmp_path):
  from absl import app

  from launchers import serve
  from morse_jax.lora import export

  route = random_route(model, seed=5)
  export.export_peft(route.experts, route.lora, model.config, [0], str(tmp_path / "ex"))
  chats = serve.adapter_chats(model, [f"ex={tmp_path / 'ex'}"], seed=0)
  assert list(chats) == ["ex"] and chats["ex"].route.lora.adapted_layers(model.config) == (1,)
  for t, e in route.experts.items():
    np.testing.assert_allclose(chats["ex"].route.experts[t].b, e.b, atol=1e-6)
  for bad, match in (("ex", "must be name=PEFT_DIR"), ("=x", "must be name=PEFT_DIR")):
    with pytest.raises(app.UsageError, match=match):
      serve.adapter_chats(model, [bad], seed=0)
  with pytest.raises(app.UsageError, match="names 'ex' twice"):
    serve.adapter_chats(model, [f"ex={tmp_path / 'ex'}"] * 2, seed=0)
