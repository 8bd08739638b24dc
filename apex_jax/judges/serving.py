"""An OpenAI-compatible chat server over `InProcessChat`, standard library only.

POST /v1/chat/completions  {"messages": [{"role", "content"}, ...], "max_tokens"?, "temperature"?,
                            "top_p"?, "n"?, "stop"?, "model"?, "chat_template_kwargs"?}
  -> {"id", "object": "chat.completion", "created", "model",
      "choices": [{"index", "message": {"role": "assistant", "content"}, "finish_reason"}],
      "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
GET /v1/models  -> {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}
GET /health     -> {"status": "ok", "model": ...}

Errors use OpenAI's shape `{"error": {"message", "type", "param"}}`: 400 naming the field and
value, 404 unknown path, 405 wrong method, 411/413 body length; 500 on an internal error, after
which the server keeps serving. `model` is accepted whatever it names (the APEx authors' clients
send "qwen"); replies carry the served name. `stream` is refused (400).

Requests queued together with the same temperature and top_p are merged into one sampler call
(as `apex_jax.tools.server.Batcher` merges searches); a request with n > 1 adds n rows.

Adapter routes (vLLM's `--lora-modules`): `adapters={name: InProcessChat with an AdapterRoute}`
on the same backbone. A request whose `model` names one is generated through that route and
answered under that name; any other name gets the base model. /v1/models lists them all.
"""

from __future__ import annotations

import logging
import time
import uuid

from apex_jax.judges.chat import JudgeRequestError
from apex_jax.judges.inprocess import Completion, InProcessChat
from apex_jax.judges.protocol import ApiError, ChatRequest, parse_chat_request
from apex_jax.tools.http import BodyError, JsonHandler, JsonServer, QueueWorker

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20
_ROUTES = {"/v1/chat/completions": "POST", "/v1/models": "GET", "/health": "GET"}


class ChatBatcher(QueueWorker):
  """Runs `chat.generate` on one thread, merging queued requests that share sampling settings."""

  thread_name = "chat-batcher"

  def __init__(self, chat: InProcessChat, max_batch: int = 64):
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    self.chat, self.max_batch = chat, max_batch
    self.calls = self.rows = 0  # sampler calls, rows generated (calls < requests: merging)
    super().__init__()

  def submit(self, prompt: list[int], req: ChatRequest,
             chat: InProcessChat | None = None) -> list[Completion]:
    """chat: the route that generates (default: the batcher's own)."""
    return self._submit(prompt, req, chat or self.chat)

  def _round(self, items) -> None:
    groups: dict[tuple[int, float, float], list] = {}
    for it in items:  # one sampler call per route and sampling setting
      groups.setdefault((id(it[2]), it[1].temperature, it[1].top_p), []).append(it)
    for (_, *key), group in groups.items():
      for chunk in self._chunks(group):
        try:
          self._run(chunk, *key)
        except Exception:  # noqa: BLE001 -- later chunks still get their answers
          log.exception("chat batcher: unexpected error")

  def _chunks(self, group):
    chunk, rows = [], 0
    for it in group:
      if chunk and rows + it[1].n > self.max_batch:
        yield chunk
        chunk, rows = [], 0
      chunk.append(it)
      rows += it[1].n
    if chunk:
      yield chunk

  def _run(self, items, temperature: float, top_p: float) -> None:
    prompts, limits, stops = [], [], []
    chat = items[0][2]
    for prompt, req, _, _ in items:
      prompts += [prompt] * req.n
      limits += [req.max_tokens] * req.n
      stops += [req.stop] * req.n
    try:
      done = chat.generate(prompts, limits, temperature=temperature, top_p=top_p,
                                stops=stops)
      self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
    except Exception as e:  # noqa: BLE001 -- handed to every waiting request as a 500
      return self._fail(items, e)
    start = 0
    for _, req, _, future in items:
      future.set_result(done[start:start + req.n])
      start += req.n


class ChatServer(JsonServer):
  label = "chat server"

  def __init__(self, address, chat: InProcessChat, model_name: str, default_max_tokens: int = 512,
               max_n: int = 16, max_batch: int = 64, verbose: bool = False,
               adapters: dict[str, InProcessChat] | None = None):
    super().__init__(address, _Handler, verbose)
    self.chat, self.model_name = chat, model_name
    self.adapters = dict(adapters or {})
    if model_name in self.adapters:
      raise ValueError(f"adapter name {model_name!r} is the base model's served name")
    for name, route in self.adapters.items():
      if route.route is None or route.model is not chat.model:
        raise ValueError(f"adapter {name!r} must be an InProcessChat with an adapter_route on "
                         f"the served model")
    self.default_max_tokens, self.max_n = default_max_tokens, max_n
    self.created = int(time.time())
    self.batcher = ChatBatcher(chat, max_batch)

  def complete(self, req: ChatRequest) -> dict:
    """The response body of a parsed request (raises ApiError on a bad prompt)."""
    name = req.model if req.model in self.adapters else self.model_name
    chat = self.adapters.get(name, self.chat)
    try:
      prompt = chat.prompt_tokens(req.messages, req.chat_template_kwargs)
    except JudgeRequestError as e:
      raise ApiError(400, str(e), "messages") from None
    try:
      chat.check_length(prompt, req.max_tokens)
    except JudgeRequestError as e:  # blame the prompt when it alone fills the context
      too_long = len(prompt) >= chat.max_context
      raise ApiError(400, str(e), "messages" if too_long else "max_tokens") from None
    done = self.batcher.submit(prompt, req, chat)
    used = sum(c.completion_tokens for c in done)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": name,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": c.finish_reason} for i, c in enumerate(done)],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": used,
                      "total_tokens": len(prompt) + used}}


class _Handler(JsonHandler):
  server: ChatServer
  server_version = "morse-chat/1"

  def _error(self, e: ApiError) -> None:
    self._send(e.status, e.payload())

  def _route(self, method: str) -> bool:
    path = self.path.split("?")[0]
    if path not in _ROUTES:
      self._error(ApiError(404, f"no such endpoint: {method} {path}", "path", "not_found_error"))
      return False
    if _ROUTES[path] != method:
      self._error(ApiError(405, f"{path} takes {_ROUTES[path]}, not {method}", "method",
                           "method_not_allowed"))
      return False
    return True

  def do_GET(self):
    if not self._route("GET"):
      return
    srv = self.server
    if self.path.split("?")[0] == "/health":
      return self._send(200, {"status": "ok", "model": srv.model_name})
    base = {"id": srv.model_name, "object": "model", "created": srv.created,
            "owned_by": "morse_jax"}
    self._send(200, {"object": "list", "data": [base] + [
        {**base, "id": name, "parent": srv.model_name} for name in srv.adapters]})

  def do_POST(self):
    if not self._route("POST"):
      return
    try:
      req = parse_chat_request(self._read_body(), self.server.default_max_tokens,
                               self.server.max_n)
      return self._send(200, self.server.complete(req))
    except ApiError as e:
      return self._error(e)
    except Exception as e:  # noqa: BLE001 -- the server stays up; the client sees a 500
      log.exception("chat server: generation failed")
      return self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}", None,
                                  "server_error"))

  def do_PUT(self):
    self._route("PUT")

  def do_DELETE(self):
    self._route("DELETE")

  def _read_body(self) -> bytes:
    try:
      return self._body(MAX_BODY_BYTES)
    except BodyError as e:
      raise ApiError(e.status, str(e), "Content-Length") from None


def make_server(chat: InProcessChat, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                **kwargs) -> ChatServer:
  """A bound server (port 0: a free one; see `.url`); call `serve_forever` or use
  `apex_jax.tools.server.running`."""
  return ChatServer((host, port), chat, model_name, **kwargs)
