"""The chat server on the generation engine (`engine_batcher.EngineBatcher`) over the tests'
tiny random model: greedy answers equal to the merged-call server's, continuous batching (a
short request answered while a long one still runs), a client that hangs up freeing its slot
and pages, an engine error failing only its requests, streaming in order, n > 1 choices (seeded,
also more choices than slots), stop strings ending a row early."""

import dataclasses
import json
import queue
import socket

import pytest

from apex_jax.judges import InProcessChat, serving
from apex_jax.judges.engine_batcher import EngineBatcher
from apex_jax.judges.protocol import ChatLimits, ChatRequest
from apex_jax.tools.server import running
from morse_jax.llm import engine_steps
from tests.apex.judges.test_server import MSG, model, post  # noqa: F401 -- a fixture
from tests.apex.judges.test_streaming import stream
from tests.apex.tools.test_server import wait_until

LIMITS = ChatLimits(max_tokens=200, max_n=8, step_tokens=4, max_batch=8)


@pytest.fixture(scope="module")
def endless(model):  # noqa: F811
  """The model without stop ids: every row runs to its budget."""
  return dataclasses.replace(model, stop_ids=())


@pytest.fixture(scope="module")
def server(endless):
  srv = serving.make_server(InProcessChat(endless, max_context=256), "tiny", port=0,
                            default_max_tokens=8, limits=LIMITS)
  with running(srv):
    yield srv


def texts(reply) -> list[str]:
  return [c["message"]["content"] for c in reply["choices"]]


def test_greedy_answers_equal_the_merged_servers(model):  # noqa: F811
  bodies = [({"messages": MSG, "max_tokens": 8, "temperature": 0.0, "n": 4},
             "/v1/chat/completions"),
            ({"prompt": ["w1 w2", "w3"], "max_tokens": 6, "temperature": 0.0, "n": 2},
             "/v1/completions")]
  answers = {}
  for engine in (True, False):
    srv = serving.make_server(InProcessChat(model, max_context=64), "tiny", port=0,
                              default_max_tokens=8, engine=engine,
                              limits=ChatLimits(max_tokens=32, chunk_tokens=4))
    with running(srv):
      assert isinstance(srv.batcher, EngineBatcher) == engine
      answers[engine] = [post(srv, body, path) for body, path in bodies]
  for (s1, new), (s2, old) in zip(answers[True], answers[False]):
    assert s1 == s2 == 200
    assert new["choices"] == old["choices"]
    assert new["usage"] == old["usage"]


def test_a_short_request_is_answered_while_a_long_one_runs(endless):
  chat = InProcessChat(endless, max_context=256)
  batcher = EngineBatcher(chat, max_batch=4, step_tokens=4)
  prompt = chat.prompt_tokens(MSG)
  updates = queue.SimpleQueue()
  long = batcher.start(prompt, ChatRequest(MSG, max_tokens=200, temperature=0.0), updates=updates)
  updates.get(timeout=120)  # the long one is generating
  short = batcher.start(prompt, ChatRequest(MSG, max_tokens=3, temperature=0.0))
  done = short.result(timeout=120)
  running_then = not long.done()
  long_done = long.result(timeout=120)
  batcher.close()
  assert running_then  # answered between the long one's steps, not after it
  assert done[0].completion_tokens == 3 and long_done[0].completion_tokens == 200
  assert long_done[0].token_ids[:3] == done[0].token_ids  # greedy: the same start


def test_a_client_that_hangs_up_frees_its_slot_and_pages(server):
  dropped = server.batcher.dropped
  s = socket.create_connection(server.server_address[:2], timeout=30)
  data = json.dumps({"messages": MSG, "max_tokens": 200, "temperature": 0.0, "n": 2}).encode()
  s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {len(data)}\r\n\r\n"
            .encode() + data)
  wait_until(lambda: server.batcher.live)
  engine, _ = server.batcher.engine(server.chat)
  handles = list(server.batcher.live[0].handles)
  wait_until(lambda: engine.pages.used > 0)
  s.close()
  wait_until(lambda: engine.pages.free == engine.pages.capacity and not engine.busy)
  assert server.batcher.dropped == dropped + 1 and not server.batcher.live
  assert [h.finish_reason for h in handles] == ["cancelled"] * 2
  assert all(len(h.tokens) < 200 for h in handles)
  assert engine.pages.available == engine.pages.capacity  # reservations returned too
  assert post(server, {"messages": MSG, "max_tokens": 4, "temperature": 0.0})[0] == 200


def test_an_engine_error_fails_its_requests_and_the_server_keeps_serving(server, monkeypatch):
  real = engine_steps.decode
  calls = []

  def broken(*args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
      raise RuntimeError("device lost")
    return real(*args, **kwargs)

  monkeypatch.setattr(engine_steps, "decode", broken)
  status, out = post(server, {"messages": MSG, "max_tokens": 4, "n": 2})
  assert status == 500 and "device lost" in out["error"]["message"]
  assert out["error"]["type"] == "server_error"
  assert post(server, {"messages": MSG, "max_tokens": 4, "temperature": 0.0})[0] == 200


def test_a_request_the_engine_refuses_fails_alone(endless):
  chat = InProcessChat(endless, max_context=256)
  batcher = EngineBatcher(chat, max_batch=4)
  good = batcher.start(chat.prompt_tokens(MSG), ChatRequest(MSG, max_tokens=8))
  bad = batcher.start([10_000], ChatRequest(MSG, max_tokens=8))  # outside the vocabulary
  with pytest.raises(ValueError, match="token id 10000 is outside the vocabulary"):
    bad.result(timeout=120)
  assert good.result(timeout=120)[0].completion_tokens == 8
  batcher.close()


def test_a_failing_step_fails_its_engines_requests_and_a_fresh_engine_serves(server):
  engine, _ = server.batcher.engine(server.chat)

  def broken():
    raise RuntimeError("scheduler bug")

  engine.step = broken
  status, out = post(server, {"messages": MSG, "max_tokens": 4})
  assert status == 500 and "scheduler bug" in out["error"]["message"]
  assert post(server, {"messages": MSG, "max_tokens": 4, "temperature": 0.0})[0] == 200
  assert server.batcher.engine(server.chat)[0] is not engine


def test_streamed_deltas_come_in_order_and_add_up_to_the_reply(server):
  body = {"max_tokens": 12, "temperature": 0.0, "n": 2}
  head, events = stream(server, {**body, "stream_options": {"include_usage": True}})
  assert head.startswith(b"HTTP/1.0 200")
  assert events[-1] == b"[DONE]" and events[-2]["choices"] == []
  whole = post(server, {"messages": [{"role": "user", "content": "hi"}], **body})[1]
  for i in range(2):
    mine = [e["choices"][0] for e in events[:-2] if e["choices"][0]["index"] == i]
    assert mine[0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [m["delta"].get("content") for m in mine[1:-1]]
    assert len(pieces) >= 2  # 12 tokens in steps of 4: text as it comes
    assert "".join(pieces) == whole["choices"][i]["message"]["content"]
    assert mine[-1]["finish_reason"] == "length"
  assert events[-2]["usage"] == whole["usage"]


@pytest.mark.slow
def test_n_choices_are_seeded_per_choice_whatever_runs_beside_them(endless):
  chat = InProcessChat(endless, max_context=256)
  prompt = chat.prompt_tokens(MSG)
  req = ChatRequest(MSG, max_tokens=6, temperature=1.0, n=4, seed=7)
  rows = lambda out: [c.token_ids for c in out]
  batcher = EngineBatcher(chat, max_batch=8)
  alone = rows(batcher.submit(prompt, req))
  other = batcher.start([5, 6, 7], ChatRequest(MSG, max_tokens=20, temperature=1.0))
  beside = rows(batcher.submit(prompt, req))
  other.result(timeout=120)
  reseeded = rows(batcher.submit(prompt, dataclasses.replace(req, seed=8)))
  batcher.close()
  few = EngineBatcher(chat, max_batch=2)  # 4 choices in 2 slots: one request each
  split = rows(few.submit(prompt, req))
  few.close()
  assert len(set(alone)) == 4 and beside == alone == split and reseeded != alone


def test_a_stop_string_ends_its_row_early(server):
  body = {"messages": MSG, "max_tokens": 40, "temperature": 0.0}
  whole = texts(post(server, body)[1])[0]
  words = whole.split()
  stop = words[2]
  status, out = post(server, {**body, "stop": [stop]})
  assert status == 200
  assert texts(out)[0] == whole[:whole.find(stop)]
  assert out["choices"][0]["finish_reason"] == "stop"
  assert out["usage"]["completion_tokens"] < 40  # cancelled at the step it appeared in


def test_a_conversations_next_turn_prefills_only_what_is_new(endless):
  """ChatLimits.prefix_cache: the next turn (the first turn's messages, its reply and a new
  message, as a chat client sends it) starts after the first turn's full pages, left in the
  engine's cache; both replies are those of a server without the cache."""
  got = {}
  for cache in (True, False):
    chat = InProcessChat(endless, max_context=256)
    srv = serving.make_server(chat, "tiny", port=0, default_max_tokens=8,
                              limits=dataclasses.replace(LIMITS, prefix_cache=cache))
    with running(srv):
      first = texts(post(srv, {"messages": MSG, "max_tokens": 40, "temperature": 0.0})[1])
      turn = MSG + [{"role": "assistant", "content": first[0]},
                    {"role": "user", "content": "w4 w5"}]
      engine, _ = srv.batcher.engine(chat)
      hit, prefilled = engine.stats["prefix_pages_hit"], engine.stats["prefill_tokens"]
      second = texts(post(srv, {"messages": turn, "max_tokens": 8, "temperature": 0.0})[1])
      got[cache] = (first, second, engine.stats["prefix_pages_hit"] - hit,
                    engine.stats["prefill_tokens"] - prefilled, len(chat.prompt_tokens(turn)))
  assert got[True][:2] == got[False][:2]
  hit, prefilled, prompt = got[True][2:]
  assert hit >= 2 and prefilled == prompt - hit * engine.config.page_size
  assert got[False][2:4] == (0, prompt)
  with pytest.raises(ValueError, match="ChatLimits.prefix_cache must be a bool, got 1"):
    ChatLimits(prefix_cache=1)
