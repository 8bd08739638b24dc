"""Streaming over raw HTTP against a fake model (no compiles): the SSE framing, an error after
the stream began (one error event, no [DONE]), and a client that hangs up mid-stream (its rows
stop at their next turn instead of generating to the end)."""

import json
import socket
import threading
import time

from apex_jax.judges import serving
from apex_jax.judges.inprocess import Completion
from apex_jax.judges.protocol import ChatLimits
from apex_jax.tools.server import running
from tests.apex.tools.test_server import wait_until

MSG = [{"role": "user", "content": "hi"}]


class WordChat:
  """One token per step; token ids decode to "w " each; `fail_on_call` raises, `delay_s`
  slows each call."""

  max_context, route, model = 1024, None, None

  def __init__(self, fail_on_call=None, delay_s=0.0):
    self.calls, self.fail_on_call, self.delay_s = 0, fail_on_call, delay_s

  def prompt_tokens(self, messages, chat_template_kwargs=None):
    return [1, 2, 3]

  def check_length(self, prompt, max_tokens):
    pass

  def generate(self, prompts, limits, *, temperature, top_p=1.0, stops=None):
    self.calls += 1
    time.sleep(self.delay_s)
    if self.calls == self.fail_on_call:
      raise RuntimeError("device lost")
    return [self.completion((7,) * n, len(p), ()) for p, n in zip(prompts, limits)]

  def completion(self, ids, prompt_len, stop):
    return Completion("w " * len(ids), "length", prompt_len, len(ids), tuple(ids))


def serve(chat):
  return running(serving.make_server(chat, "fake", port=0, default_max_tokens=8,
                                     limits=ChatLimits(chunk_tokens=2, max_tokens=64)))


def stream(srv, body: dict, read=True) -> tuple[bytes, list]:
  """(the status line and headers, the events' data) of a streamed request."""
  data = json.dumps({"messages": MSG, "stream": True, **body}).encode()
  s = socket.create_connection(srv.server_address[:2], timeout=30)
  s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {len(data)}\r\n\r\n"
            .encode() + data)
  if not read:
    return s, []
  reply = b""
  while chunk := s.recv(65536):
    reply += chunk
  s.close()
  head, _, rest = reply.partition(b"\r\n\r\n")
  events = [e[len(b"data: "):] for e in rest.split(b"\n\n") if e]
  return head, [e if e == b"[DONE]" else json.loads(e) for e in events]


def test_events_are_role_text_in_turns_finish_usage_done():
  with serve(WordChat()) as srv:
    head, events = stream(srv, {"max_tokens": 6, "n": 2,
                                "stream_options": {"include_usage": True}})
  assert head.startswith(b"HTTP/1.0 200") and b"Content-Type: text/event-stream" in head
  assert events[-1] == b"[DONE]"
  chunks = events[:-1]
  assert [c["choices"][0]["delta"] for c in chunks[:2]] == [{"role": "assistant",
                                                            "content": ""}] * 2
  for i in range(2):
    mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
    texts = [m["delta"].get("content") for m in mine[1:-1]]
    assert "".join(texts) == "w " * 6 and len(texts) == 3  # 3 turns of 2 tokens
    assert mine[-1] == {"index": i, "delta": {}, "logprobs": None, "finish_reason": "length"}
  assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
      "prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}


def test_an_error_after_the_stream_began_is_an_error_event():
  with serve(WordChat(fail_on_call=2)) as srv:
    head, events = stream(srv, {"max_tokens": 6})
    assert head.startswith(b"HTTP/1.0 200") and b"[DONE]" not in events
    assert events[1]["choices"][0]["delta"] == {"content": "w w "}  # turn 1 was sent
    error = events[-1]["error"]
    assert error["type"] == "server_error" and "device lost" in error["message"]
    assert stream(srv, {"max_tokens": 2})[1][-1] == b"[DONE]"  # and it keeps serving


def test_a_client_that_hangs_up_stops_its_generation():
  chat = WordChat(delay_s=0.05)
  with serve(chat) as srv:
    s, _ = stream(srv, {"max_tokens": 64}, read=False)  # 32 turns of 2 tokens
    wait_until(lambda: chat.calls >= 2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()  # a reset: the server's next write fails
    wait_until(lambda: srv.batcher.qsize() == 0 and srv.open_connections == 0)
    calls = chat.calls
    time.sleep(0.3)
    assert chat.calls == calls < 12, calls
    _, events = stream(srv, {"max_tokens": 2})
    assert events[-1] == b"[DONE]"
