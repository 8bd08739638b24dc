"""ChatClient against a scripted local HTTP server: retries, timeouts, no retry on 4xx, reply
validation."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apex_jax.judges import (ChatClient, JudgeRequestError, JudgeResponseError, JudgeTimeout,
                             JudgeUnavailable, complete_many)
from apex_jax.judges.chat import chat_url

MSG = [{"role": "user", "content": "hi"}]


def ok(text="hello"):
  return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                               "content": text}}]})


class Scripted(ThreadingHTTPServer):
  """Answers request i with script[i]: (status, body), "sleep" (outlives the client's timeout)
  or "drop" (closes the connection without a reply); the last entry repeats."""
  daemon_threads = True

  def __init__(self, script):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.script, self.seen = list(script), []
    self.lock = threading.Lock()

  def next(self, body, headers):
    with self.lock:
      self.seen.append((json.loads(body), dict(headers)))
      action = self.script[min(len(self.seen), len(self.script)) - 1]
    return action(json.loads(body)) if callable(action) else action


class _Handler(BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):
    body = self.rfile.read(int(self.headers["Content-Length"]))
    action = self.server.next(body, self.headers)
    if action == "drop":
      self.close_connection = True
      self.connection.shutdown(2)
      return
    if action == "sleep":
      time.sleep(0.5)
      action = ok()
    status, payload = action
    data = payload.encode()
    try:
      self.send_response(status)
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
      pass


@pytest.fixture
def serve():
  servers = []

  def start(script):
    srv = Scripted(script)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    servers.append(srv)
    host, port = srv.server_address
    return srv, f"http://{host}:{port}/v1"
  yield start
  for srv in servers:
    srv.shutdown()
    srv.server_close()


def client(url, **kw):
  sleeps = []
  kw = {"retries": 2, "backoff_s": 0.1, "jitter": 0.0, "timeout_s": 2.0, **kw}
  return ChatClient(url, "qwen", sleep=sleeps.append, **kw), sleeps


def test_request_body_headers_and_reply(serve):
  srv, url = serve([ok("A")])
  c, _ = client(url, api_key="k", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
  assert c.complete(MSG, max_tokens=5, temperature=0.1) == "A"
  body, headers = srv.seen[0]
  assert body == {"model": "qwen", "messages": MSG, "max_tokens": 5, "temperature": 0.1,
                  "chat_template_kwargs": {"enable_thinking": False}}
  assert headers["Authorization"] == "Bearer k"
  assert c.stats() == dict(calls=1, requests=1, retries=0, failures=0)


@pytest.mark.parametrize("first", [(500, "boom"), (503, "{}"), (429, '{"error": "slow down"}'),
                                   "drop"])
def test_retries_transient_failures(serve, first):
  srv, url = serve([first, first, ok("fine")])
  c, sleeps = client(url)
  assert c.complete(MSG, max_tokens=5, temperature=0.0) == "fine"
  assert len(srv.seen) == 3 and sleeps == [0.1, 0.2]  # backoff_s * 2^(attempt-1)
  assert c.stats()["retries"] == 2


def test_gives_up_after_the_last_try(serve):
  srv, url = serve([(502, "bad gateway")])
  c, sleeps = client(url, retries=3)
  with pytest.raises(JudgeUnavailable, match="no reply after 4 attempts.*HTTP 502") as e:
    c.complete(MSG, max_tokens=5, temperature=0.0)
  assert e.value.status == 502 and e.value.attempts == 4 and len(srv.seen) == 4
  assert c.stats()["failures"] == 1


def test_no_retry_on_4xx_and_the_server_message_is_kept(serve):
  error = {"error": {"message": "field 'max_tokens' must be in [1, 8], got 99", "type": "x",
                     "param": "max_tokens"}}
  srv, url = serve([(400, json.dumps(error))])
  c, sleeps = client(url)
  with pytest.raises(JudgeRequestError, match="HTTP 400: field 'max_tokens'.*got 99") as e:
    c.complete(MSG, max_tokens=99, temperature=0.0)
  assert e.value.status == 400 and len(srv.seen) == 1 and sleeps == []


def test_timeout_is_retried_then_raised(serve):
  srv, url = serve(["sleep"])
  c, _ = client(url, retries=1, timeout_s=0.1)
  with pytest.raises(JudgeTimeout, match="timed out"):
    c.complete(MSG, max_tokens=5, temperature=0.0)
  assert len(srv.seen) == 2


def test_connection_refused_is_unavailable():
  c, sleeps = client("http://127.0.0.1:9", retries=1)  # port 9 (discard): nothing listens
  with pytest.raises(JudgeUnavailable, match="connection failed"):
    c.complete(MSG, max_tokens=5, temperature=0.0)
  assert len(sleeps) == 1


@pytest.mark.parametrize("body, match", [
    ("not json", "reply is not JSON"), ("{}", "reply has no field 'choices'"),
    ('{"choices": []}', r"reply.choices must be a non-empty list"),
    ('{"choices": [{"text": "x"}]}', r"reply.choices\[0\] has no field 'message'"),
    ('{"choices": [{"message": {"role": "assistant"}}]}',
     r"reply.choices\[0\].message has no field 'content'"),
    ('{"choices": [{"message": {"content": null}}]}',
     r"reply.choices\[0\].message.content must be a string, got NoneType")])
def test_malformed_replies_name_the_field(serve, body, match):
  srv, url = serve([(200, body)])
  c, _ = client(url)
  with pytest.raises(JudgeResponseError, match=match):
    c.complete(MSG, max_tokens=5, temperature=0.0)
  assert len(srv.seen) == 1


def test_complete_many_keeps_each_conversations_error(serve):
  def answer(body):  # the conversation saying "bad" is rejected, whatever the arrival order
    text = body["messages"][0]["content"]
    return (400, '{"error": {"message": "bad"}}') if text == "bad" else ok(text.upper())
  srv, url = serve([answer])
  c, _ = client(url)
  convs = [[{"role": "user", "content": t}] for t in ("a", "bad", "c")]
  out = complete_many(c, convs, max_tokens=3, temperature=0.0)
  assert out[0] == "A" and out[2] == "C" and isinstance(out[1], JudgeRequestError)
  assert len(srv.seen) == 3


def test_urls_and_config_errors():
  assert chat_url("http://h:1") == chat_url("http://h:1/v1/") == \
      chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
  with pytest.raises(ValueError, match="not an http"):
    ChatClient("h:1", "m")
  with pytest.raises(ValueError, match="retries=-1"):
    ChatClient("http://h:1", "m", retries=-1)
