"""Parsing and validation of OpenAI chat-completion requests for `serving.py`.

Every rejection names the field (`param`) and the value, in OpenAI's error shape. Where OpenAI's
server would coerce (a string "5" for max_tokens) we reject instead.
"""

from __future__ import annotations

import dataclasses
import json

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 4


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


def _describe(value) -> str:
  return f"{type(value).__name__} {json.dumps(value)[:60]}"


def _number(req: dict, field: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
  value = req.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ApiError(400, f"field '{field}' must be a number, got {_describe(value)}", field)
  if value > high or value < low or (low_open and value == low):
    bounds = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
    raise ApiError(400, f"field '{field}' must be in {bounds}, got {value}", field)
  return float(value)


def _integer(req: dict, field: str, default: int, high: int) -> int:
  value = req.get(field)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, int):
    raise ApiError(400, f"field '{field}' must be an integer, got {_describe(value)}", field)
  if not 1 <= value <= high:
    raise ApiError(400, f"field '{field}' must be in [1, {high}], got {value}", field)
  return value


def _content(value, where: str) -> str:
  """A message's content: a string, or OpenAI's list of {"type": "text", "text"} parts."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    texts = []
    for j, part in enumerate(value):
      if not (isinstance(part, dict) and part.get("type") == "text"
              and isinstance(part.get("text"), str)):
        raise ApiError(400, f"{where}.content[{j}] must be a text part "
                            f"{{\"type\": \"text\", \"text\": str}}, got {_describe(part)}",
                       "messages")
      texts.append(part["text"])
    return "".join(texts)
  raise ApiError(400, f"{where}.content must be a string, got {_describe(value)}", "messages")


def _messages(req: dict) -> list[dict]:
  if "messages" not in req:
    raise ApiError(400, "missing field 'messages' (a list of {role, content})", "messages")
  messages = req["messages"]
  if not isinstance(messages, list) or not messages:
    raise ApiError(400, f"field 'messages' must be a non-empty list, got {_describe(messages)}",
                   "messages")
  out = []
  for i, m in enumerate(messages):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise ApiError(400, f"{where} must be an object, got {_describe(m)}", "messages")
    if m.get("role") not in ROLES:
      raise ApiError(400, f"{where}.role must be one of {ROLES}, got {_describe(m.get('role'))}",
                     "messages")
    out.append({"role": m["role"], "content": _content(m.get("content"), where)})
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
  return tuple(s for s in stops if s)


def parse_chat_request(body: bytes, default_max_tokens: int, max_n: int = 16,
                       max_tokens_limit: int = 1 << 20) -> ChatRequest:
  """A /v1/chat/completions body -> ChatRequest, or ApiError(400) naming the field."""
  try:
    req = json.loads(body.decode("utf-8"))
  except UnicodeDecodeError:
    raise ApiError(400, "body is not UTF-8", None) from None
  except json.JSONDecodeError as e:
    raise ApiError(400, f"invalid JSON: {e.msg} (line {e.lineno} column {e.colno})", None) \
        from None
  if not isinstance(req, dict):
    raise ApiError(400, f"expected a JSON object, got {_describe(req)}", None)
  if req.get("stream"):
    raise ApiError(400, f"field 'stream' is not supported, got {_describe(req['stream'])}",
                   "stream")
  model = req.get("model")
  if model is not None and not isinstance(model, str):
    raise ApiError(400, f"field 'model' must be a string, got {_describe(model)}", "model")
  kwargs = req.get("chat_template_kwargs")
  if kwargs is not None and not isinstance(kwargs, dict):
    raise ApiError(400, f"field 'chat_template_kwargs' must be an object, got "
                        f"{_describe(kwargs)}", "chat_template_kwargs")
  field = "max_tokens" if req.get("max_tokens") is not None else "max_completion_tokens"
  return ChatRequest(
      messages=_messages(req),
      max_tokens=_integer(req, field, default_max_tokens, max_tokens_limit),
      temperature=_number(req, "temperature", 1.0, 0.0, 2.0),
      top_p=_number(req, "top_p", 1.0, 0.0, 1.0, low_open=True),
      n=_integer(req, "n", 1, max_n), stop=_stop(req), model=model,
      chat_template_kwargs=kwargs)
