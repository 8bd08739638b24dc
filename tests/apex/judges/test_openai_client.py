"""The chat server through the official `openai` client (what any OpenAI-compatible caller
uses): models, chat, n > 1, stop strings, streaming (server-sent events, in turns of
`chunk_tokens`), plain completions, and a refused field as the client's BadRequestError. The
server is the object `launchers.serve` builds (`serving.make_server`) over the tests' tiny
random model; every generating request has 4 rows, max_tokens 8, temperature 0 and turns of 4
tokens: the shapes test_hardening's server compiles."""

import openai
import pytest

from apex_jax.judges import InProcessChat, serving
from apex_jax.judges.protocol import ChatLimits
from apex_jax.judges.streaming import Deltas, safe_prefix
from apex_jax.tools.server import running
from tests.apex.judges.test_server import MSG, model  # noqa: F401 -- a fixture

ARGS = {"model": "tiny", "messages": MSG, "max_tokens": 8, "temperature": 0.0, "n": 4}


@pytest.fixture(scope="module")
def client(model):  # noqa: F811
  srv = serving.make_server(InProcessChat(model, max_context=64), "tiny", port=0, max_n=4,
                            limits=ChatLimits(chunk_tokens=4, step_tokens=4))
  with running(srv):
    yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def greedy(client):
  """The greedy reply, not streamed (4 equal rows)."""
  out = client.chat.completions.create(**ARGS)
  assert len({c.message.content for c in out.choices}) == 1
  return out


def test_models_and_chat_with_n_rows(client, greedy):
  assert [m.id for m in client.models.list()] == ["tiny"]
  assert greedy.object == "chat.completion" and greedy.model == "tiny"
  assert [c.index for c in greedy.choices] == [0, 1, 2, 3]
  assert all(c.message.role == "assistant" for c in greedy.choices)
  assert greedy.usage.total_tokens == greedy.usage.prompt_tokens + greedy.usage.completion_tokens
  assert 4 <= greedy.usage.completion_tokens <= 4 * 8


def test_stop_sequence_cuts_the_reply(client, greedy):
  text = greedy.choices[0].message.content
  words = text.split()
  if len(words) < 2:
    pytest.skip(f"the greedy reply {text!r} has no second word to stop at")
  out = client.chat.completions.create(**ARGS, stop=[words[1]])
  assert out.choices[0].message.content == text[:text.find(words[1])]
  assert out.choices[0].finish_reason == "stop"


def test_streaming_sends_role_deltas_finish_and_usage(client, greedy):
  chunks = list(client.chat.completions.create(**ARGS, stream=True,
                                               stream_options={"include_usage": True}))
  assert {c.object for c in chunks} == {"chat.completion.chunk"}
  assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
  for i in range(4):
    mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
    assert mine[0].delta.role == "assistant" and mine[0].delta.content == ""
    assert [m.finish_reason for m in mine][-1] == greedy.choices[i].finish_reason
    assert all(m.finish_reason is None for m in mine[:-1])
    text = "".join(m.delta.content or "" for m in mine)
    assert text == greedy.choices[i].message.content  # the deltas add up to the whole reply
  if greedy.usage.completion_tokens == 4 * 8:  # 8 tokens each, turns of 4: text came in pieces
    pieces = [c for c in chunks if c.choices and c.choices[0].index == 0
              and c.choices[0].delta.content]
    assert len(pieces) >= 2
  assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == {
      **chunks[-1].usage.model_dump(), **greedy.usage.model_dump()}


def test_plain_completions_and_their_stream(client):
  out = client.completions.create(model="tiny", prompt=["w1 w2", "w3"], max_tokens=8,
                                  temperature=0.0, n=2)
  assert out.object == "text_completion" and [c.index for c in out.choices] == [0, 1, 2, 3]
  assert out.choices[0].text == out.choices[1].text and out.choices[2].text == out.choices[3].text
  streamed = list(client.completions.create(model="tiny", prompt=["w1 w2", "w3"], max_tokens=8,
                                            temperature=0.0, n=2, stream=True))
  for i in range(4):
    assert "".join(c.choices[0].text for c in streamed if c.choices[0].index == i) \
        == out.choices[i].text


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"extra_body": {"chat_template": "{{ x }}"}}, "chat_template"),
    ({"extra_body": {"top_k": 5}}, "top_k")])
def test_unimplemented_fields_are_bad_requests_naming_them(client, fields, param):
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(**{**ARGS, **fields})
  assert e.value.param == param, e.value.body


def test_no_op_values_of_unimplemented_fields_are_accepted(client, greedy):
  out = client.chat.completions.create(**ARGS, presence_penalty=0, frequency_penalty=0.0,
                                       logprobs=False, response_format={"type": "text"})
  assert out.choices[0].message.content == greedy.choices[0].message.content


def test_deltas_hold_back_what_may_still_change():
  assert safe_prefix("abc STO", ["STOP"]) == "abc "  # may become the stop string
  assert safe_prefix("abc ST x", ["STOP"]) == "abc ST x"
  assert safe_prefix("ab\ufffd", []) == "ab"  # a character still missing bytes
  d = Deltas(1)
  assert d.update(0, "he", ["hello"]) == ""
  assert d.update(0, "help", ["hello"]) == "help"
  assert d.update(0, "help me", []) == " me"
  assert d.finish(0, "help me now") == " now" and d.sent[0] == "help me now"


@pytest.mark.slow  # ~2 min on a shared CPU: a process of its own loads the toy model, compiles
def test_launcher_serves_the_toy_model_to_the_openai_client():
  """`python -m launchers.serve --model=assets/toy_qwen3` as users start it, then the client:
  models, chat, n = 2, stop, streaming; SIGTERM ends it with exit 0."""
  import os
  import re
  import signal
  import subprocess
  import sys
  import time

  from tests import test_configs

  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
  proc = subprocess.Popen(
      [sys.executable, "-m", "launchers.serve", "--model=assets/toy_qwen3", "--port=0",
       "--chunk_tokens=4", "--default_max_tokens=8"], cwd=test_configs.ROOT,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  lines = []
  try:
    port, deadline = None, time.monotonic() + 300
    while port is None and time.monotonic() < deadline:
      line = proc.stdout.readline()
      if not line:
        break
      lines.append(line)
      m = re.search(r"serving \S+ at http://127\.0\.0\.1:(\d+)/v1", line)
      port = int(m.group(1)) if m else None
    assert port, "".join(lines)[-3000:]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=300)
    assert [m.id for m in client.models.list()] == ["toy_qwen3"]
    args = {"model": "toy_qwen3", "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0.0}
    one = client.chat.completions.create(**args)
    two = client.chat.completions.create(**args, n=2)
    text = one.choices[0].message.content
    assert [c.message.content for c in two.choices] == [text, text]
    if len(text) > 2:
      cut = client.chat.completions.create(**args, stop=[text[2:4]])
      assert cut.choices[0].message.content == text[:text.find(text[2:4])]
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(**args, stream=True))
    assert streamed == text
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    lines.append(rest)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, "".join(lines)[-3000:]
