"""Parsing and validation of OpenAI chat-completion requests for `serving.py`.

Every rejection names the field (`param`) and the value, in OpenAI's error shape. Where OpenAI's
server would coerce (a string "5" for max_tokens) we reject instead. Numbers must be finite (NaN
and Infinity parse as JSON extensions and are refused by name), strings valid Unicode (no lone
surrogates), and the request small: `ChatLimits` bounds the body, JSON depth and number size, the
messages' characters (checked before any tokenizing), max_tokens and n. A client's own
`chat_template` (top level, or in chat_template_kwargs, or any argument of the template call
itself) is refused: a template is code.

Every field is implemented or refused, never silently ignored: a field of OpenAI's schema that
this server does not implement is 400 naming it (`tools`, `logprobs`, a `response_format`
other than text, ...) unless it has its no-op value (`presence_penalty: 0`,
`logprobs: false`, `tool_choice: "none"`, ...) or is null (OpenAI's "not given"); a field outside
the schema is 400 as unknown.
"""

from __future__ import annotations

import dataclasses
import json
import math

from morse_jax.serving.http import HttpLimits, check_text, describe, load_json

from apex_jax.tools import images as images_lib

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_TEMPLATE_VALUE_CHARS = 256
# apply_chat_template's own arguments: a client may not set them through chat_template_kwargs
RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "tools", "documents", "tokenize", "return_dict", "return_tensors",
    "add_generation_prompt", "continue_final_message", "padding", "truncation", "max_length",
    "tokenizer_kwargs", "return_assistant_tokens_mask", "conversation", "messages"})


@dataclasses.dataclass(frozen=True)
class ChatLimits(HttpLimits):
  """Every bound of the chat server (each a `launchers.serve` flag)."""

  max_prompt_chars: int = 262144  # characters of all messages' contents (before tokenizing)
  max_messages: int = 256
  max_tokens: int = 4096  # the largest max_tokens a request may ask for
  max_n: int = 16
  max_batch: int = 64  # rows generated at once (the engine's slots; rows per merged call)
  chunk_tokens: int = 128  # merged calls (`ChatBatcher`): new tokens per row per turn
  step_tokens: int = 8  # the engine: new tokens per row per step (streamed text comes per step)
  cache_tokens: int = 65536  # the engine's KV pool per route (at least one row of the context)
  prefix_cache: bool = True  # the engine keeps finished requests' full KV pages: a chat's next
  # turn (its history sent again) or a shared system prompt prefills only what is new


class ApiError(Exception):
  """An HTTP error answered as {"error": {"message", "type", "param"}}."""

  def __init__(self, status: int, message: str, param: str | None,
               kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.param, self.kind = status, param, kind

  def payload(self) -> dict:
    return {"error": {"message": str(self), "type": self.kind, "param": self.param}}


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  messages: list[dict]
  max_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  n: int = 1
  stop: tuple[str, ...] = ()
  model: str | None = None
  chat_template_kwargs: dict | None = None
  stream: bool = False  # answer as server-sent events (chat.completion.chunk objects)
  include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
  prompts: tuple[str, ...] = ()  # /v1/completions: the plain-text prompts (no chat template)
  seed: int | None = None  # reproducible samples (a signed 64-bit integer, as vLLM's)
  # `image_url` parts in message order: (field, uint8 [448, 448, 3]); their messages' content
  # is then a list of {"type": "text", "text"} and {"type": "image"} parts (the HF chat form)
  images: tuple = ()


# OpenAI's chat/completions request fields this server does not implement, with the value(s)
# that change nothing (accepted); any other non-null value is 400 naming the field
_NO_OP = object()
UNIMPLEMENTED_CHAT = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
    "logprobs": (False,), "top_logprobs": (0,), "tool_choice": ("none",), "tools": ([],),
    "functions": ([],), "function_call": ("none",), "parallel_tool_calls": (_NO_OP,),
    "user": (_NO_OP,), "store": (False,), "metadata": (_NO_OP,),
    "modalities": (["text"],), "audio": (_NO_OP,), "prediction": (_NO_OP,),
    "reasoning_effort": (_NO_OP,), "service_tier": ("auto", "default"), "verbosity": (_NO_OP,),
    "web_search_options": (_NO_OP,), "prompt_cache_key": (_NO_OP,),
    "safety_identifier": (_NO_OP,), "response_format": ({"type": "text"},)}
IMPLEMENTED_CHAT = frozenset({
    "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stop", "stream", "stream_options", "chat_template_kwargs", "seed"})
# /v1/completions (legacy): its own schema
UNIMPLEMENTED_COMPLETION = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
    "logprobs": (0,), "echo": (False,), "suffix": ("",), "user": (_NO_OP,),
    "best_of": (1,)}
IMPLEMENTED_COMPLETION = frozenset({
    "prompt", "model", "max_tokens", "temperature", "top_p", "n", "stop", "stream",
    "stream_options", "seed"})


def _check_fields(req: dict, implemented: frozenset, unimplemented: dict, where: str) -> None:
  """400 for the first field that is neither implemented nor null nor a no-op value."""
  for field, value in req.items():
    if field in implemented or value is None:
      continue
    _text(field, "a field name", None)
    if field == "chat_template":
      raise ApiError(400, f"field 'chat_template' refused: a client's chat template is not "
                          f"accepted (the server renders its own); got {_describe(value)}", field)
    if field not in unimplemented:
      raise ApiError(400, f"unknown field {field[:60]!r} for {where}", field[:60])
    if not any(value == ok and type(value) is type(ok) or (
        isinstance(ok, float) and type(value) is int and value == ok)
        for ok in unimplemented[field] if ok is not _NO_OP):
      noop = [json.dumps(ok) for ok in unimplemented[field] if ok is not _NO_OP]
      allowed = f" (accepted: null or {' / '.join(noop)})" if noop else " (accepted: null)"
      raise ApiError(400, f"field '{field}' is not supported by this server{allowed}, got "
                          f"{_describe(value)}", field)


_describe = describe


def _text(value: str, where: str, param: str) -> str:
  bad = check_text(value, where)
  if bad:
    raise ApiError(400, f"{bad}: {_describe(value)}", param)
  return value


def _number(req: dict, field: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
  value = req.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ApiError(400, f"field '{field}' must be a number, got {_describe(value)}", field)
  if not math.isfinite(value):
    raise ApiError(400, f"field '{field}' must be a finite number, got {_describe(value)}", field)
  if value > high or value < low or (low_open and value == low):
    bounds = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
    raise ApiError(400, f"field '{field}' must be in {bounds}, got {value}", field)
  return float(value)


def _integer(req: dict, field: str, default: int | None, high: int, low: int = 1) -> int | None:
  value = req.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, int):
    raise ApiError(400, f"field '{field}' must be an integer, got {_describe(value)}", field)
  if not low <= value <= high:
    raise ApiError(400, f"field '{field}' must be in [{low}, {high}], got {value}", field)
  return value


def _seed(req: dict) -> int | None:
  return _integer(req, "seed", None, 2**63 - 1, low=-2**63)


def _content(value, where: str, images: list) -> str | list[dict]:
  """A message's content: a string, or OpenAI's list of {"type": "text", "text"} and
  {"type": "image_url", "image_url": {"url": data URL}} parts; text only: the joined text, else
  the parts (each image decoded into `images` as (field, pixels))."""
  if isinstance(value, str):
    return _text(value, f"{where}.content", "messages")
  if isinstance(value, list):
    parts = []
    for j, part in enumerate(value):
      field = f"{where}.content[{j}]"
      if isinstance(part, dict) and part.get("type") == "image_url":
        images.append((f"{field}.image_url.url", _image(part, field)))
        parts.append({"type": "image"})
        continue
      if not (isinstance(part, dict) and part.get("type") == "text"
              and isinstance(part.get("text"), str)):
        raise ApiError(400, f"{field} must be a text part {{\"type\": \"text\", \"text\": str}} "
                            f"or an image_url part, got {_describe(part)}", "messages")
      parts.append({"type": "text", "text": _text(part["text"], f"{field}.text", "messages")})
    if any(p["type"] == "image" for p in parts):
      return parts
    return "".join(p["text"] for p in parts)
  raise ApiError(400, f"{where}.content must be a string, got {_describe(value)}", "messages")


def _image(part: dict, field: str):
  """An `image_url` part's image, uint8 [448, 448, 3] (any size is resized, as the APEx
  authors' executor resizes its images); 400 naming the field for a URL that is not a base64
  image data URL (nothing is fetched), an undecodable or too large image."""
  extra = sorted(set(part) - {"type", "image_url"})
  if extra:
    raise ApiError(400, f"{field}: unknown key {extra[0][:40]!r} in an image_url part", field)
  spec = part.get("image_url")
  if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
    raise ApiError(400, f"{field}.image_url must be an object {{\"url\": str}}, got "
                        f"{_describe(spec)}", f"{field}.image_url")
  if spec.get("detail", "auto") not in ("auto", None) or set(spec) - {"url", "detail"}:
    raise ApiError(400, f"{field}.image_url takes \"url\" and \"detail\": \"auto\" only (images "
                        f"run at 448 x 448), got {_describe(spec)}", f"{field}.image_url")
  try:
    return images_lib.decode_base64(spec["url"], f"{field}.image_url.url")
  except images_lib.ImageError as e:
    raise ApiError(400, str(e)[:500], f"{field}.image_url.url") from None


def _chars(content) -> int:
  return len(content) if isinstance(content, str) else sum(len(p.get("text", ""))
                                                          for p in content)


def _messages(req: dict, limits: ChatLimits, images: list) -> list[dict]:
  if "messages" not in req:
    raise ApiError(400, "missing field 'messages' (a list of {role, content})", "messages")
  messages = req["messages"]
  if not isinstance(messages, list) or not messages:
    raise ApiError(400, f"field 'messages' must be a non-empty list, got {_describe(messages)}",
                   "messages")
  if len(messages) > limits.max_messages:
    raise ApiError(400, f"{len(messages)} messages; at most {limits.max_messages}", "messages")
  out, chars = [], 0
  for i, m in enumerate(messages):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise ApiError(400, f"{where} must be an object, got {_describe(m)}", "messages")
    if m.get("role") not in ROLES:
      raise ApiError(400, f"{where}.role must be one of {ROLES}, got {_describe(m.get('role'))}",
                     "messages")
    out.append({"role": m["role"], "content": _content(m.get("content"), where, images)})
    chars += _chars(out[-1]["content"])
    if chars > limits.max_prompt_chars:  # before any tokenizing: the cheap bound first
      raise ApiError(400, f"messages have more than {limits.max_prompt_chars} characters (at "
                          f"{where}); the prompt is too long", "messages")
  return out


def _stop(req: dict) -> tuple[str, ...]:
  stop = req.get("stop")
  if stop is None:
    return ()
  stops = [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) \
      or len(stops) > MAX_STOPS:
    raise ApiError(400, f"field 'stop' must be a string or a list of at most {MAX_STOPS} strings, "
                        f"got {_describe(stop)}", "stop")
  for i, s in enumerate(stops):
    if len(s) > MAX_STOP_CHARS:
      raise ApiError(400, f"stop[{i}] has {len(s)} characters; at most {MAX_STOP_CHARS}", "stop")
    _text(s, f"stop[{i}]", "stop")
  return tuple(s for s in stops if s)


def _template_kwargs(req: dict) -> dict | None:
  """chat_template_kwargs: variables for the server's own template (e.g. enable_thinking), each
  a short JSON scalar; a template of the client's, or the template call's own arguments, are
  refused."""
  kwargs = req.get("chat_template_kwargs")
  if kwargs is None:
    return None
  if not isinstance(kwargs, dict):
    raise ApiError(400, f"field 'chat_template_kwargs' must be an object, got "
                        f"{_describe(kwargs)}", "chat_template_kwargs")
  for key, value in kwargs.items():
    where = f"chat_template_kwargs.{key[:40]}"
    _text(key, "chat_template_kwargs key", "chat_template_kwargs")
    if key in RESERVED_TEMPLATE_KWARGS:
      what = ("a client's chat template is not accepted (the server renders its own)"
              if key == "chat_template" else "is an argument of the template call, not a variable")
      raise ApiError(400, f"field '{where}' refused: {what}; got {_describe(value)}",
                     "chat_template_kwargs")
    if not key.isidentifier() or len(key) > 64:
      raise ApiError(400, f"field 'chat_template_kwargs' key {_describe(key)} must be an "
                          f"identifier of at most 64 characters", "chat_template_kwargs")
    ok = value is None or isinstance(value, bool) or (
        isinstance(value, (int, float)) and math.isfinite(value)) or (
        isinstance(value, str) and len(value) <= MAX_TEMPLATE_VALUE_CHARS)
    if not ok:
      raise ApiError(400, f"field '{where}' must be null, a boolean, a finite number or a string "
                          f"of at most {MAX_TEMPLATE_VALUE_CHARS} characters, got "
                          f"{_describe(value)}", "chat_template_kwargs")
    if isinstance(value, str):
      _text(value, where, "chat_template_kwargs")
  return kwargs


def parse_chat_request(body: bytes, default_max_tokens: int, max_n: int | None = None,
                       max_tokens_limit: int | None = None,
                       limits: ChatLimits | None = None) -> ChatRequest:
  """A /v1/chat/completions body -> ChatRequest, or ApiError(400) naming the field."""
  limits = limits or ChatLimits()
  max_n = max_n or limits.max_n
  max_tokens_limit = max_tokens_limit or limits.max_tokens
  req = _load(body, limits)
  _check_fields(req, IMPLEMENTED_CHAT, UNIMPLEMENTED_CHAT, "/v1/chat/completions")
  kwargs = _template_kwargs(req)
  field = "max_tokens" if req.get("max_tokens") is not None else "max_completion_tokens"
  stream, include_usage = _stream(req)
  images = []
  return ChatRequest(
      messages=_messages(req, limits, images),
      max_tokens=_integer(req, field, default_max_tokens, max_tokens_limit),
      temperature=_number(req, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(req, "top_p", 1.0, 0.0, 1.0, low_open=True),
      n=_integer(req, "n", 1, max_n), stop=_stop(req), model=_model(req),
      chat_template_kwargs=kwargs, stream=stream, include_usage=include_usage, seed=_seed(req),
      images=tuple(images))


def parse_completion_request(body: bytes, default_max_tokens: int, max_n: int | None = None,
                             limits: ChatLimits | None = None) -> ChatRequest:
  """A /v1/completions body (`prompt`: a string or a list of strings, completed as plain text
  without the chat template) -> ChatRequest with `prompts` set, or ApiError(400). The rows asked
  for, prompts times n, are at most max_n."""
  limits = limits or ChatLimits()
  max_n = max_n or limits.max_n
  req = _load(body, limits)
  _check_fields(req, IMPLEMENTED_COMPLETION, UNIMPLEMENTED_COMPLETION, "/v1/completions")
  prompt = req.get("prompt")
  prompts = [prompt] if isinstance(prompt, str) else prompt
  if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
    raise ApiError(400, f"field 'prompt' must be a string or a non-empty list of strings, got "
                        f"{_describe(prompt)}", "prompt")
  chars = 0
  for i, p in enumerate(prompts):
    _text(p, f"prompt[{i}]", "prompt")
    chars += len(p)
    if chars > limits.max_prompt_chars:
      raise ApiError(400, f"prompt has more than {limits.max_prompt_chars} characters (at "
                          f"prompt[{i}]); the prompt is too long", "prompt")
  n = _integer(req, "n", 1, max_n)
  if len(prompts) * n > max_n:
    raise ApiError(400, f"{len(prompts)} prompts x n {n} = {len(prompts) * n} completions; at "
                        f"most {max_n}", "prompt")
  stream, include_usage = _stream(req)
  return ChatRequest(
      messages=[], max_tokens=_integer(req, "max_tokens", default_max_tokens, limits.max_tokens),
      temperature=_number(req, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(req, "top_p", 1.0, 0.0, 1.0, low_open=True), n=n, stop=_stop(req),
      model=_model(req), stream=stream, include_usage=include_usage, prompts=tuple(prompts),
      seed=_seed(req))


def _load(body: bytes, limits: ChatLimits) -> dict:
  try:
    req = load_json(body, limits.max_json_depth, limits.max_number_digits)
  except ValueError as e:
    raise ApiError(400, str(e), "body") from None
  if not isinstance(req, dict):
    raise ApiError(400, f"expected a JSON object, got {_describe(req)}", None)
  return req


def _model(req: dict) -> str | None:
  model = req.get("model")
  if model is not None and (not isinstance(model, str) or len(model) > 256):
    raise ApiError(400, f"field 'model' must be a string of at most 256 characters, got "
                        f"{_describe(model)}", "model")
  if model is not None:
    _text(model, "field 'model'", "model")
  return model


def _stream(req: dict) -> tuple[bool, bool]:
  """(stream, include_usage) from `stream` and `stream_options` ({"include_usage": bool})."""
  stream = req.get("stream")
  if stream is not None and not isinstance(stream, bool):
    raise ApiError(400, f"field 'stream' must be true or false, got {_describe(stream)}",
                   "stream")
  options = req.get("stream_options")
  if options is None:
    return bool(stream), False
  if not stream:
    raise ApiError(400, "field 'stream_options' is only allowed with stream: true",
                   "stream_options")
  if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
      options.get("include_usage", False), bool):
    raise ApiError(400, f"field 'stream_options' must be {{\"include_usage\": bool}}, got "
                        f"{_describe(options)}", "stream_options")
  return True, options.get("include_usage", False)
