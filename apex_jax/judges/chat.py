"""Chat backends for the judges: an OpenAI-compatible HTTP client (vLLM, SGLang,
`launchers.serve`) and, in `inprocess.py`, a loaded `morse_jax.llm.Model`.

Both answer `complete(messages, *, max_tokens, temperature) -> str`. `complete_many` answers a
list of conversations with one entry per conversation: the reply, or the `JudgeError` that
conversation ended with, so one bad conversation never costs the others their replies.

The HTTP client retries connection errors, timeouts, 5xx and 429 with exponential backoff
(`backoff_s * 2^(attempt-1)`, capped, +-jitter); other 4xx are not retried (the request itself is
wrong). The APEx authors call their judge through the `openai` client with
`extra_body={"chat_template_kwargs": {"enable_thinking": False}}` (J-Ding519/APEx
TTRL/TTRL-nogt/local_search/judge_nogt.py); pass that as `extra_body` to do the same.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from typing import Callable, Protocol, Sequence
from urllib.parse import urlsplit

from morse_jax.serving.http import RemoteError, backoff_delay, with_retries


class JudgeError(RemoteError):
  """A chat completion that produced no reply."""


class JudgeRequestError(JudgeError):
  """The backend rejected the request (4xx other than 429, or an invalid prompt); not retried."""


class JudgeResponseError(JudgeError):
  """The backend answered, but not with `choices[0].message.content`; not retried."""


class JudgeUnavailable(JudgeError):
  """Every attempt failed with a connection error, timeout, 5xx or 429."""


class JudgeTimeout(JudgeUnavailable):
  """As JudgeUnavailable, the last attempt having timed out."""


class ChatBackend(Protocol):
  def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str: ...


def complete_many(backend: ChatBackend, conversations: Sequence[list[dict]], *, max_tokens: int,
                  temperature: float) -> list[str | JudgeError]:
  """One reply (or JudgeError) per conversation, batched where the backend can batch."""
  if hasattr(backend, "complete_many"):
    return backend.complete_many(conversations, max_tokens=max_tokens, temperature=temperature)
  out: list[str | JudgeError] = []
  for messages in conversations:
    try:
      out.append(backend.complete(messages, max_tokens=max_tokens, temperature=temperature))
    except JudgeError as e:
      out.append(e)
  return out


def chat_url(base_url: str) -> str:
  """`http://host:port`, `.../v1` or the full endpoint -> `.../v1/chat/completions`."""
  parts = urlsplit(base_url)
  if parts.scheme not in ("http", "https") or not parts.netloc:
    raise ValueError(f"base_url {base_url!r} is not an http(s) URL")
  url = base_url.rstrip("/")
  for suffix in ("/chat/completions", "/v1"):
    url = url[:-len(suffix)] if url.endswith(suffix) else url
  return url + "/v1/chat/completions"


def reply_content(payload: bytes) -> str:
  """`choices[0].message.content` of an OpenAI chat completion, or JudgeResponseError naming
  the missing or mistyped field."""
  try:
    reply = json.loads(payload.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise JudgeResponseError(f"reply is not JSON ({e}): {payload[:80]!r}") from None
  path, node = "reply", reply
  for key in ("choices", 0, "message", "content"):
    if isinstance(key, int):
      if not isinstance(node, list) or not node:
        raise JudgeResponseError(f"{path} must be a non-empty list, got {str(node)[:60]}")
    elif not isinstance(node, dict) or key not in node:
      raise JudgeResponseError(f"{path} has no field {key!r}: {str(node)[:80]}")
    node, path = node[key], f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
  if not isinstance(node, str):
    raise JudgeResponseError(f"{path} must be a string, got {type(node).__name__} {node!r:.40}")
  return node


def _error_message(payload: bytes) -> str:
  """The server's error text: OpenAI's {"error": {"message"}} or anything else, shortened."""
  try:
    error = json.loads(payload.decode("utf-8")).get("error")
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
  except Exception:  # noqa: BLE001 -- any body at all is only used for the message
    return payload[:300].decode("utf-8", "replace")


class ChatClient:
  """`complete(messages)` against `POST {base_url}/v1/chat/completions` (standard library only)."""

  def __init__(self, base_url: str, model: str, timeout_s: float = 60.0, retries: int = 3,
               backoff_s: float = 0.5, api_key: str | None = None, max_backoff_s: float = 8.0,
               jitter: float = 0.1, max_concurrency: int = 16, extra_body: dict | None = None,
               sleep: Callable[[float], None] = time.sleep):
    if timeout_s <= 0 or retries < 0 or backoff_s < 0 or max_concurrency < 1:
      raise ValueError(f"need timeout_s > 0, retries >= 0, backoff_s >= 0, max_concurrency >= 1; "
                       f"got timeout_s={timeout_s}, retries={retries}, backoff_s={backoff_s}, "
                       f"max_concurrency={max_concurrency}")
    self.url, self.model, self.api_key = chat_url(base_url), model, api_key
    self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
    self.max_backoff_s, self.jitter, self.sleep = max_backoff_s, jitter, sleep
    self.max_concurrency, self.extra_body = max_concurrency, dict(extra_body or {})
    self._lock = threading.Lock()
    self._stats = dict(calls=0, requests=0, retries=0, failures=0)

  def stats(self) -> dict:
    """calls (complete), requests (HTTP attempts), retries, failures (calls that raised)."""
    with self._lock:
      return dict(self._stats)

  def _add(self, **counts) -> None:
    with self._lock:
      for key, n in counts.items():
        self._stats[key] += n

  def backoff(self, attempt: int) -> float:
    return backoff_delay(attempt, self.backoff_s, self.max_backoff_s, self.jitter)

  def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str:
    self._add(calls=1)
    body = json.dumps({**self.extra_body, "model": self.model, "messages": messages,
                       "max_tokens": max_tokens, "temperature": temperature}).encode("utf-8")
    try:
      return with_retries(lambda: reply_content(self._post(body)), retries=self.retries,
                          retryable=JudgeUnavailable, delay=self.backoff, sleep=self.sleep,
                          on_retry=lambda: self._add(retries=1))
    except JudgeUnavailable as last:
      self._add(failures=1)
      cls = JudgeTimeout if isinstance(last, JudgeTimeout) else JudgeUnavailable
      raise cls(f"{self.url}: no reply after {self.retries + 1} attempts; last: {last}",
                last.status, self.retries + 1) from None
    except JudgeError:
      self._add(failures=1)
      raise

  def complete_many(self, conversations: Sequence[list[dict]], *, max_tokens: int,
                    temperature: float) -> list[str | JudgeError]:
    """Concurrent requests (a batching server such as `launchers.serve` merges them)."""
    def one(messages):
      try:
        return self.complete(messages, max_tokens=max_tokens, temperature=temperature)
      except JudgeError as e:
        return e
    if len(conversations) <= 1:
      return [one(m) for m in conversations]
    workers = min(self.max_concurrency, len(conversations))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="judge") as pool:
      return list(pool.map(one, conversations))

  def _post(self, body: bytes) -> bytes:
    headers = {"Content-Type": "application/json"}
    if self.api_key:
      headers["Authorization"] = f"Bearer {self.api_key}"
    request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
    self._add(requests=1)
    try:
      with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
        return response.read()
    except urllib.error.HTTPError as e:
      message = f"{self.url}: HTTP {e.code}: {_error_message(e.read())}"
      if e.code == 429 or e.code >= 500:
        raise JudgeUnavailable(message, e.code) from None
      raise JudgeRequestError(message, e.code) from None
    except (TimeoutError, socket.timeout) as e:
      raise JudgeTimeout(f"{self.url}: timed out after {self.timeout_s}s ({e})") from None
    except urllib.error.URLError as e:
      if isinstance(e.reason, (TimeoutError, socket.timeout)):
        raise JudgeTimeout(f"{self.url}: timed out after {self.timeout_s}s") from None
      raise JudgeUnavailable(f"{self.url}: connection failed: {e.reason}") from None
    except (HTTPException, OSError) as e:  # reset connections, truncated replies
      raise JudgeUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
