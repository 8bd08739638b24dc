"""An OpenAI-compatible chat server over `InProcessChat`, standard library only.

POST /v1/chat/completions  {"messages": [{"role", "content"}, ...], "max_tokens"?, "temperature"?,
                            "top_p"?, "n"?, "stop"?, "seed"?, "model"?, "chat_template_kwargs"?,
                            "stream"?, "stream_options"?}
  -> {"id", "object": "chat.completion", "created", "model",
      "choices": [{"index", "message": {"role": "assistant", "content"}, "finish_reason"}],
      "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
POST /v1/completions  {"prompt": str | [str, ...], "max_tokens"?, ... as above but messages}
  -> {"id", "object": "text_completion", "created", "model",
      "choices": [{"index", "text", "logprobs": null, "finish_reason"}], "usage"}
     (the prompt as it comes, no chat template; choice index = prompt index * n + row)
GET /v1/models  -> {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}
GET /health     -> {"status": "ok", "model": ...}

Message content is text: `<|im_end|>` inside a message is encoded as the tokens of its
characters, so only the chat template's own markers are control tokens (`Tokenizer`). A
Qwen2.5-VL model on the engine also takes `{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}` parts (as OpenAI's API and the APEx authors' client send them):
each decoded and resized to 448 x 448, rendered by the model's chat template as an image part and
expanded to its 256 image tokens. A URL that is not a base64 image data URL (nothing is fetched),
an undecodable or too large image, or images for a text-only model: 400 naming the part's field
(`messages[1].content[0].image_url.url`). The raw
`prompt` of /v1/completions is the caller's already templated prompt and is parsed, special
tokens included (as vLLM does): a client that builds one from untrusted text must use the chat
endpoint instead.

With "stream": true either POST answers server-sent events (`streaming`): text is sent as it
is generated (each engine step: `ChatLimits.step_tokens` tokens per row; with merged calls,
as each turn of at most `ChatLimits.chunk_tokens` tokens per row ends). Errors use OpenAI's shape
`{"error": {"message", "type", "param"}}`: 400 naming the field and value (fields this server
does not implement included, see `protocol`), 404 unknown path, 405 wrong method, 411/413 body
length; 500 on an internal error, after which the server keeps serving. `model` is accepted
whatever it names (the APEx authors' clients send "qwen"); replies carry the served name.

Generation: an InProcessChat on one device runs on the engine (`engine_batcher.EngineBatcher`:
continuous batching over a paged KV cache; a request enters a free slot between steps and is
answered as soon as its own rows end; `ChatLimits.max_batch` slots, `cache_tokens` of KV per
route). `seed` (a signed 64-bit integer) makes a request's samples reproducible: each choice
draws from keys of the seed, its prompt and choice index alone, whatever runs beside it; n > 1
choices differ from each other. Without a seed, rows draw from the route's key and call counter.

`ChatBatcher` (merged sampler calls) stays for what the engine does not run: a chat on a mesh of
several devices (the engine is one device's) and backends that only have `generate` (the tests'
scripted ones). Requests queued together with the same temperature and top_p are merged into one
sampler call; a request with n > 1 adds n rows; choice i of a seeded request draws each turn with
a key from the seed, i and its tokens so far (`inprocess.seeded_keys`). A turn generates at most
`chunk_tokens` new tokens per row; a request with more to go is put back at the end of the queue
with its tokens so far appended to its prompt (a prefill per turn; no KV cache kept between
turns), and a failed merged call is retried one request at a time.

A client that hangs up stops costing the server: a handler waiting for its answer looks at its
socket every `http.HANGUP_POLL_S` (`JsonHandler.client_gone`: the connection reads as ended or
failed), and a stream also between updates; on a hang-up it cancels its jobs and returns, so its
thread and its place under the connection cap are free at once. The engine frees a cancelled
request's slot and pages at its next step (`ChatBatcher`: dropped at its next turn); a queued
one never runs (`dropped` counts them). Every request is checked before it is queued: the body's
bytes, the messages' characters, then the tokenized prompt + max_tokens against the context; the
queue is bounded (503 when full). `ChatLimits` holds every bound.

Adapter routes (vLLM's `--lora-modules`): `adapters={name: InProcessChat with an AdapterRoute}`
on the same backbone. A request whose `model` names one is generated through that route and
answered under that name; any other name gets the base model. /v1/models lists them all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import time
import uuid

from morse_jax.serving.http import (HANGUP_POLL_S, BodyError, JsonHandler, JsonServer, QueueWorker,
                                    Unavailable, settle)

from apex_jax.judges.chat import JudgeRequestError
from apex_jax.judges.engine_batcher import EngineBatcher
from apex_jax.judges.inprocess import (Completion, InProcessChat, runs_on_engine, seeded_keys,
                                       turn_key)
from apex_jax.judges.protocol import (ApiError, ChatLimits, ChatRequest, parse_chat_request,
                                      parse_completion_request)
from apex_jax.judges.streaming import ChunkWriter, Deltas

log = logging.getLogger(__name__)
MAX_BODY_BYTES = ChatLimits.max_body_bytes
_ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET",
           "/health": "GET"}


@dataclasses.dataclass(eq=False)
class _Job:
  """One request in the batcher: its rows' tokens so far, and which rows are finished."""

  prompt: list[int]
  req: ChatRequest
  chat: InProcessChat
  future: object
  updates: object = None  # a queue that gets (tag, rows so far) after each unfinished turn
  tag: int = 0
  rows: list = dataclasses.field(default_factory=list)
  done: list = dataclasses.field(default_factory=list)
  turns: int = 0
  keys: object = None  # with a seed: each row's own key (choice tag * n + row of the request)
  dropped: bool = False  # cancelled, and counted so by the batcher

  def __post_init__(self):
    self.rows = [[] for _ in range(self.req.n)]
    self.done = [False] * self.req.n
    if self.req.seed is not None:
      self.keys = seeded_keys(self.req.seed, self.tag * self.req.n, self.req.n)

  def key(self, i: int):
    """Row i's key for its next turn (None: no seed, the call's key): a function of the seed,
    the row and its tokens so far alone."""
    return None if self.keys is None else turn_key(self.keys[i], len(self.rows[i]))

  def active(self) -> list[int]:
    return [i for i, d in enumerate(self.done) if not d]

  def __getitem__(self, i):  # QueueWorker reads item[-1] as the future
    return (self.prompt, self.req, self.chat, self.future)[i]


class ChatBatcher(QueueWorker):
  """Runs `chat.generate` on one thread, merging queued requests that share sampling settings,
  at most `chunk_tokens` new tokens per row per turn (longer requests queue again)."""

  thread_name = "chat-batcher"

  def __init__(self, chat: InProcessChat, max_batch: int = 64, max_queue: int = 256,
               chunk_tokens: int = 128):
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    if chunk_tokens < 1:
      raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    self.chat, self.max_batch, self.chunk_tokens = chat, max_batch, chunk_tokens
    self.calls = self.rows = 0  # sampler calls, rows generated (calls < requests: merging)
    self.requeued = self.isolated = 0  # turns given back to the queue; failed merges split
    super().__init__(max_queue)

  def submit(self, prompt: list[int], req: ChatRequest,
             chat: InProcessChat | None = None) -> list[Completion]:
    """chat: the route that generates (default: the batcher's own)."""
    return self.start(prompt, req, chat).result()

  def start(self, prompt: list[int], req: ChatRequest, chat: InProcessChat | None = None,
            updates: queue.SimpleQueue | None = None, tag: int = 0) -> concurrent.futures.Future:
    """Queues a request; its Future gets the completions. With `updates`, each turn that
    leaves it unfinished puts `(tag, [token ids so far per row])` there. Cancelling the Future
    (a client gone) drops the request at its next turn: it never runs again."""
    future = concurrent.futures.Future()
    self._put(_Job(list(prompt), req, chat or self.chat, future, updates, tag))
    return future

  def _room(self, items) -> bool:
    return sum(len(j.active()) for j in items if not j.future.done()) < self.max_batch

  def _live(self, jobs: list) -> list:
    """The jobs still wanted; a cancelled one is counted in `dropped` (once) and left out."""
    live = []
    for job in jobs:
      if not job.future.done():
        live.append(job)
      elif job.future.cancelled() and not job.dropped:
        job.dropped = True
        with self._cv:  # `_put` counts the cancelled jobs it prunes under it too
          self.dropped += 1
    return live

  def _round(self, items) -> None:
    groups: dict[tuple[int, float, float], list] = {}
    for job in self._live(items):  # one sampler call per route and sampling setting
      groups.setdefault((id(job.chat), job.req.temperature, job.req.top_p), []).append(job)
    for (_, *key), group in groups.items():
      for chunk in self._chunks(group):
        if not self._run(chunk, *key) and len(chunk) > 1:
          self.isolated += 1  # a failing merged call: each request alone, so only its own fails
          for job in chunk:
            self._run([job], *key)

  def _chunks(self, group):
    chunk, rows = [], 0
    for job in group:
      n = len(job.active())
      if chunk and rows + n > self.max_batch:
        yield chunk
        chunk, rows = [], 0
      chunk.append(job)
      rows += n
    if chunk:
      yield chunk

  def _run(self, jobs, temperature: float, top_p: float) -> bool:
    """One turn of `jobs` (those cancelled since the round began left out); False (nothing
    changed) when the merged call fails and there are several jobs, else the error goes to the
    one job."""
    jobs = self._live(jobs)
    if not jobs:
      return True
    prompts, limits, where, keys = [], [], [], []
    chat = jobs[0].chat
    for job in jobs:
      for i in job.active():
        prompts.append(job.prompt + job.rows[i])
        limits.append(min(self.chunk_tokens, job.req.max_tokens - len(job.rows[i])))
        where.append((job, i))
        keys.append(job.key(i))
    seeded = any(k is not None for k in keys)
    try:
      done = chat.generate(prompts, limits, temperature=temperature, top_p=top_p,
                           keys=keys if seeded else None)
      self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
    except Exception as e:  # noqa: BLE001 -- a lone request gets it as a 500
      if len(jobs) > 1:
        return False
      self._fail(jobs, e)
      return True
    for (job, i), limit, completion in zip(where, limits, done):
      ids = list(completion.token_ids)
      job.rows[i] += ids
      ended = (completion.finish_reason == "stop" or len(ids) < limit
               or len(job.rows[i]) >= job.req.max_tokens)
      if not ended and job.req.stop:  # a stop string may span turns: look at the whole text
        ended = chat.completion(job.rows[i], len(job.prompt), job.req.stop).finish_reason == "stop"
      job.done[i] = ended
    for job in jobs:
      job.turns += 1
      if not self._live([job]):  # cancelled while generating: its client is gone
        continue
      if all(job.done):
        settle(job.future, [chat.completion(r, len(job.prompt), job.req.stop) for r in job.rows])
      else:
        if job.updates is not None:
          job.updates.put((job.tag, [list(r) for r in job.rows]))
        self.requeued += 1
        self._requeue(job)
    return True


class ChatServer(JsonServer):
  label = "chat server"

  def __init__(self, address, chat: InProcessChat, model_name: str, default_max_tokens: int = 512,
               max_n: int | None = None, max_batch: int | None = None, verbose: bool = False,
               adapters: dict[str, InProcessChat] | None = None,
               limits: ChatLimits | None = None, engine: bool | None = None):
    """engine: generate on the engine (None: when every route can, `runs_on_engine`), else
    merged sampler calls (`ChatBatcher`)."""
    limits = limits or ChatLimits()
    if not 1 <= default_max_tokens <= limits.max_tokens:
      raise ValueError(f"default_max_tokens must be in [1, {limits.max_tokens}] (max_tokens "
                       f"limit), got {default_max_tokens}")
    super().__init__(address, _Handler, verbose, limits)
    self.chat, self.model_name = chat, model_name
    self.adapters = dict(adapters or {})
    if model_name in self.adapters:
      raise ValueError(f"adapter name {model_name!r} is the base model's served name")
    for name, route in self.adapters.items():
      if route.route is None or route.model is not chat.model:
        raise ValueError(f"adapter {name!r} must be an InProcessChat with an adapter_route on "
                         f"the served model")
    self.default_max_tokens, self.max_n = default_max_tokens, max_n or limits.max_n
    self.created = int(time.time())
    self.hung_up = 0  # requests whose client left before its answer: their jobs cancelled
    self.batcher = self._batcher(engine, max_batch or limits.max_batch)

  def _batcher(self, engine: bool | None, max_batch: int):
    routes = [self.chat, *self.adapters.values()]
    if engine is None:
      engine = all(runs_on_engine(c) for c in routes)
    elif engine and not all(runs_on_engine(c) for c in routes):
      raise ValueError("engine=True needs every route to be an InProcessChat on one device")
    if engine:
      return EngineBatcher(self.chat, max_batch, self.limits.max_queue, self.limits.cache_tokens,
                           self.limits.step_tokens, self.limits.prefix_cache)
    return ChatBatcher(self.chat, max_batch, self.limits.max_queue, self.limits.chunk_tokens)

  def prepare(self, req: ChatRequest) -> tuple[str, InProcessChat, list[list[int]]]:
    """(served name, route, token prompts) of a parsed request: the chat template's one prompt,
    or /v1/completions' plain-text prompts; ApiError on a bad or too long prompt."""
    name = req.model if req.model in self.adapters else self.model_name
    chat = self.adapters.get(name, self.chat)
    field = "prompt" if req.prompts else "messages"
    if req.images:
      self.check_images(req, chat, name)
    try:
      if req.prompts:
        prompts = [chat.model.tokenizer.encode(p, parse_special_tokens=True) for p in req.prompts]
      elif req.images:
        prompts = [chat.prompt_tokens(req.messages, req.chat_template_kwargs,
                                      images=len(req.images))]
      else:  # a chat without images: any backend's prompt_tokens (the tests' fakes too)
        prompts = [chat.prompt_tokens(req.messages, req.chat_template_kwargs)]
    except JudgeRequestError as e:
      raise ApiError(400, str(e)[:500], field) from None
    for prompt in prompts:
      if not prompt:
        raise ApiError(400, "the prompt is empty (0 tokens)", field)
      try:
        chat.check_length(prompt, req.max_tokens)
      except JudgeRequestError as e:  # blame the prompt when it alone fills the context
        too_long = len(prompt) >= chat.max_context
        raise ApiError(400, str(e), field if too_long else "max_tokens") from None
    return name, chat, prompts

  def check_images(self, req: ChatRequest, chat: InProcessChat, name: str) -> None:
    """A request with images needs a Qwen2.5-VL model on the engine: 400 naming the first
    image's field otherwise."""
    field = req.images[0][0]
    if getattr(chat, "vl", None) is None:
      raise ApiError(400, f"{field}: the model {name!r} takes no images (a text-only model)",
                     field)
    if not isinstance(self.batcher, EngineBatcher):
      raise ApiError(400, f"{field}: images run on the engine (one device); this server "
                          f"generates with merged sampler calls, which take no images", field)

  def start(self, req: ChatRequest, chat: InProcessChat, prompts: list[list[int]],
            updates: queue.SimpleQueue | None = None) -> list[concurrent.futures.Future]:
    """One batcher job per prompt (tagged with its index); all cancelled when one cannot be
    queued (Unavailable is raised)."""
    futures = []
    try:
      for k, prompt in enumerate(prompts):
        futures.append(self.batcher.start(prompt, req, chat, updates, k))
    except Unavailable:
      for f in futures:
        f.cancel()
      raise
    return futures

  def complete(self, req: ChatRequest, gone=lambda: False) -> dict | None:
    """The response body of a parsed request (raises ApiError on a bad prompt); None when
    `gone()` said the client hung up while it waited (its jobs are cancelled)."""
    name, chat, prompts = self.prepare(req)
    futures = self.start(req, chat, prompts)
    while concurrent.futures.wait(futures, timeout=HANGUP_POLL_S).not_done:
      if gone():
        return self.cancel(futures)
    done = [c for f in futures for c in f.result()]
    return self.body(req, name, prompts, done)

  def cancel(self, futures) -> None:
    """A request whose client hung up: its jobs stop at their next turn, or never start."""
    for f in futures:
      f.cancel()
    with self._lock:
      self.hung_up += 1

  @staticmethod
  def body(req: ChatRequest, name: str, prompts, done: list[Completion]) -> dict:
    if req.prompts:
      head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
      choices = [{"index": i, "text": c.text, "logprobs": None,
                  "finish_reason": c.finish_reason} for i, c in enumerate(done)]
    else:
      head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
      choices = [{"index": i, "message": {"role": "assistant", "content": c.text},
                  "finish_reason": c.finish_reason} for i, c in enumerate(done)]
    return {**head, "created": int(time.time()), "model": name, "choices": choices,
            "usage": usage(prompts, done)}


def usage(prompts, done) -> dict:
  """OpenAI's usage: each prompt counted once (n rows share it), every generated token."""
  prompt_tokens = sum(len(p) for p in prompts)
  used = sum(c.completion_tokens for c in done)
  return {"prompt_tokens": prompt_tokens, "completion_tokens": used,
          "total_tokens": prompt_tokens + used}


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
    srv = self.server
    try:
      if self.path.split("?")[0] == "/v1/completions":
        req = parse_completion_request(self._read_body(), srv.default_max_tokens, srv.max_n,
                                       limits=srv.limits)
      else:
        req = parse_chat_request(self._read_body(), srv.default_max_tokens, srv.max_n,
                                 limits=srv.limits)
      if req.stream:
        return self._stream(req)
      body = srv.complete(req, self.client_gone)
      if body is not None:  # else the client is gone: nobody to answer
        self._send(200, body)
    except ApiError as e:
      return self._error(e)
    except Unavailable as e:
      return self._error(ApiError(503, str(e), None, "server_busy"))
    except Exception as e:  # noqa: BLE001 -- the server stays up; the client sees a 500
      log.error("chat server: generation failed: %s: %.200s", type(e).__name__, e)
      return self._error(ApiError(500, f"internal error: {type(e).__name__}: {str(e)[:200]}",
                                  None, "server_error"))

  def _stream(self, req: ChatRequest) -> None:
    """Server-sent events for `req` (see `streaming`): errors before the first byte are
    answered as usual; after it, as one error event. A client that hangs up (seen while
    waiting for a turn, or before each is sent) cancels its rows."""
    srv = self.server
    name, chat, prompts = srv.prepare(req)
    updates = queue.SimpleQueue()
    futures = srv.start(req, chat, prompts, updates)
    srv.count(200)
    try:
      self.send_response(200)
      self.send_header("Content-Type", "text/event-stream")
      self.send_header("Cache-Control", "no-cache")
      self.send_header("Connection", "close")
      self.end_headers()
      prefix = "chatcmpl" if not req.prompts else "cmpl"
      out = ChunkWriter(self.wfile.write, not req.prompts, f"{prefix}-{uuid.uuid4().hex}",
                        int(time.time()), name)
      deltas, n = Deltas(len(prompts) * req.n), req.n
      for i in range(len(prompts) * n):
        out.role(i)
      while True:  # every turn's update is queued before the request's Future is set
        finished = all(f.done() for f in futures)
        if not finished and self.client_gone():
          return srv.cancel(futures)
        try:
          k, rows = updates.get_nowait() if finished else updates.get(timeout=HANGUP_POLL_S)
        except queue.Empty:
          if finished:
            break
          continue
        for j, ids in enumerate(rows):
          text = chat.completion(ids, len(prompts[k]), req.stop).text
          out.text(k * n + j, deltas.update(k * n + j, text, req.stop))
      try:
        done = [c for f in futures for c in f.result()]
      except Exception as e:  # noqa: BLE001 -- after the headers: an error event
        status, kind = (503, "server_busy") if isinstance(e, Unavailable) else (500,
                                                                                "server_error")
        if status == 500:
          log.error("chat server: generation failed: %s: %.200s", type(e).__name__, e)
        out.error(ApiError(status, f"{type(e).__name__}: {str(e)[:200]}", None, kind).payload())
        return
      for i, c in enumerate(done):
        out.text(i, deltas.finish(i, c.text))
        out.finish(i, c.finish_reason)
      if req.include_usage:
        out.usage(usage(prompts, done))
      out.done()
    except OSError:  # the client hung up: its rows stop at their next turn
      srv.cancel(futures)

  def do_PUT(self):
    self._route("PUT")

  def do_DELETE(self):
    self._route("DELETE")

  def _read_body(self) -> bytes:
    try:
      return self._body(self.server.limits.max_body_bytes)
    except BodyError as e:
      raise ApiError(e.status, str(e), "Content-Length") from None


def make_server(chat: InProcessChat, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                **kwargs) -> ChatServer:
  """A bound server (port 0: a free one; see `.url`); call `serve_forever` or use
  `apex_jax.tools.server.running`."""
  return ChatServer((host, port), chat, model_name, **kwargs)
