"""Server-sent events for `stream: true`, as OpenAI clients read them.

  data: {chunk}\\n\\n  ...  data: [DONE]\\n\\n

/v1/chat/completions streams `chat.completion.chunk` objects: per choice a first delta with the
role, then content deltas, then an empty delta with its finish_reason; /v1/completions streams
`text_completion` objects whose choices carry `text` pieces. With stream_options.include_usage
a last chunk has `choices: []` and the usage. An error after the stream began is one event
`{"error": {...}}` (the openai client raises it), then the stream ends without [DONE].

Text is sent as it comes (each engine step, or as the merged batcher's turns end), held back
where it may still change: the last characters that could begin a stop
string, and a trailing U+FFFD (a character whose UTF-8 bytes have not all been generated). The
concatenated deltas equal the whole reply's text (`Deltas.finish`).
"""

from __future__ import annotations

import json


def event(payload) -> bytes:
  return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8", "replace") + b"\n\n"


DONE = b"data: [DONE]\n\n"


def safe_prefix(text: str, stops) -> str:
  """The part of a reply in progress that more tokens cannot change: without a trailing
  U+FFFD, and without a tail that a stop string could start with."""
  text = text.rstrip("\ufffd")
  hold = 0
  for stop in stops:
    for k in range(min(len(stop) - 1, len(text)), hold, -1):
      if text.endswith(stop[:k]):
        hold = k
        break
  return text[:len(text) - hold]


class Deltas:
  """What has been sent of each choice; `update` and `finish` return the new text to send."""

  def __init__(self, n: int):
    self.sent = [""] * n

  def update(self, i: int, text: str, stops) -> str:
    safe = safe_prefix(text, stops)
    if not safe.startswith(self.sent[i]) or len(safe) == len(self.sent[i]):
      return ""
    new, self.sent[i] = safe[len(self.sent[i]):], safe
    return new

  def finish(self, i: int, text: str) -> str:
    """The rest of choice i's final text. A prefix that decoding later changed cannot be taken
    back; what follows it is sent, so the choice's text still ends as the reply does."""
    sent, self.sent[i] = self.sent[i], text
    return text[len(sent):] if text.startswith(sent) else text[len(_common(sent, text)):]


def _common(a: str, b: str) -> str:
  k = 0
  while k < min(len(a), len(b)) and a[k] == b[k]:
    k += 1
  return a[:k]


class ChunkWriter:
  """Builds the stream's chunks for one request (`chat`: chat.completion.chunk, else
  text_completion) and writes them with `write(bytes)`."""

  def __init__(self, write, chat: bool, rid: str, created: int, model: str):
    self._write, self.chat = write, chat
    self.base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                 "created": created, "model": model}

  def _choice(self, index: int, delta: dict | None = None, text: str = "",
              finish_reason: str | None = None) -> dict:
    if self.chat:
      return {"index": index, "delta": delta or {}, "logprobs": None,
              "finish_reason": finish_reason}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

  def send(self, choices: list[dict], **extra) -> None:
    self._write(event({**self.base, "choices": choices, **extra}))

  def role(self, index: int) -> None:
    if self.chat:
      self.send([self._choice(index, {"role": "assistant", "content": ""})])

  def text(self, index: int, text: str) -> None:
    if text:
      self.send([self._choice(index, {"content": text}, text)])

  def finish(self, index: int, reason: str) -> None:
    self.send([self._choice(index, finish_reason=reason)])

  def usage(self, usage: dict) -> None:
    self.send([], usage=usage)

  def done(self) -> None:
    self._write(DONE)

  def error(self, payload: dict) -> None:
    self._write(event(payload))
