"""The executor's search tool: an HTTP client for a Search-R1 `/retrieve` server, and the same
`search(queries) -> list[list[Passage]]` in process (`LocalSearch`, for tests and the CPU demo).

The client retries connection errors, timeouts, 5xx and 429 with exponential backoff, never other
4xx (the request itself is wrong, sending it again cannot help); it bounds requests in flight with
a semaphore and requests per second with a token bucket; both are shared by all threads using one
client. Counts of requests, retries and failures are in `stats()`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPException
from typing import Callable, Protocol, Sequence
from urllib.parse import urlsplit

from morse_jax.serving.http import RemoteError, backoff_delay, with_retries

from apex_jax.tools.index import Retriever
from apex_jax.tools.passages import Passage, format_passages, format_results  # noqa: F401

__all__ = ["Passage", "format_passages", "format_results", "Searcher", "SearchClient",
           "LocalSearch", "TokenBucket", "SearchError", "SearchRequestError",
           "SearchUnavailable", "SearchTimeout"]


class SearchError(RemoteError):
  """A search that did not return results."""


class SearchRequestError(SearchError):
  """The server rejected the request (4xx other than 429); not retried."""


class SearchUnavailable(SearchError):
  """Every attempt failed with a connection error, timeout, 5xx or 429."""


class SearchTimeout(SearchUnavailable):
  """As SearchUnavailable, the last attempt having timed out."""


class Searcher(Protocol):
  def search(self, queries: Sequence[str]) -> list[list[Passage]]: ...


def _check_queries(queries) -> list[str]:
  if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
    raise TypeError(f"queries must be a list of strings, got {queries!r:.80}")
  return list(queries)


class TokenBucket:
  """At most `rate` grants per second on average, `burst` at once; thread-safe.

  A caller reserves its token under the lock (the count may go negative) and sleeps outside it
  until the token is due, so waiting callers are served in arrival order. `clock` and `sleep`
  are injectable: tests drive the bucket with a fake clock and count grants."""

  def __init__(self, rate: float, burst: int = 1, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep):
    if rate <= 0 or burst < 1:
      raise ValueError(f"need rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
    self.rate, self.burst, self.clock, self.sleep = float(rate), int(burst), clock, sleep
    self._tokens, self._last = float(burst), clock()
    self._lock = threading.Lock()

  def acquire(self) -> float:
    """Blocks until a token is available; returns the (clock) time it was granted."""
    with self._lock:
      now = self.clock()
      self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
      self._last = now
      self._tokens -= 1.0
      wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
    if wait > 0:
      self.sleep(wait)
    return now + wait


class SearchClient:
  """`search(queries)` against a Search-R1 `/retrieve` server (urllib, no extra dependency)."""

  def __init__(self, url: str, topk: int = 3, timeout_s: float = 30.0, retries: int = 3,
               backoff_s: float = 0.5, max_backoff_s: float = 8.0, jitter: float = 0.1,
               max_concurrency: int = 16, rate_limit_per_s: float | None = None,
               burst: int | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep):
    if topk < 1 or retries < 0 or max_concurrency < 1 or timeout_s <= 0:
      raise ValueError(f"need topk >= 1, retries >= 0, max_concurrency >= 1, timeout_s > 0; got "
                       f"topk={topk}, retries={retries}, max_concurrency={max_concurrency}, "
                       f"timeout_s={timeout_s}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
      raise ValueError(f"url {url!r} is not an http(s) URL")
    self.url = url if parts.path not in ("", "/") else url.rstrip("/") + "/retrieve"
    self.topk, self.timeout_s, self.retries = topk, timeout_s, retries
    self.backoff_s, self.max_backoff_s, self.jitter = backoff_s, max_backoff_s, jitter
    self.sleep = sleep
    self._sem = threading.BoundedSemaphore(max_concurrency)
    self._bucket = (TokenBucket(rate_limit_per_s, burst or 1, clock, sleep)
                    if rate_limit_per_s else None)
    self._lock = threading.Lock()
    self._stats = dict(searches=0, requests=0, retries=0, failures=0, in_flight=0,
                       max_in_flight=0)

  def stats(self) -> dict:
    """searches (calls), requests (HTTP attempts), retries, failures (calls that raised),
    in_flight now and the most seen at once."""
    with self._lock:
      return dict(self._stats)

  def _add(self, **counts) -> None:
    with self._lock:
      for key, n in counts.items():
        self._stats[key] += n
      self._stats["max_in_flight"] = max(self._stats["max_in_flight"], self._stats["in_flight"])

  def backoff(self, attempt: int) -> float:
    return backoff_delay(attempt, self.backoff_s, self.max_backoff_s, self.jitter)

  def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
    queries = _check_queries(queries)
    self._add(searches=1)
    if not queries:
      return []
    body = json.dumps({"queries": queries, "topk": topk or self.topk,
                       "return_scores": True}).encode("utf-8")
    try:
      return with_retries(lambda: _parse_response(self._post(body), len(queries)),
                          retries=self.retries, retryable=SearchUnavailable, delay=self.backoff,
                          sleep=self.sleep, on_retry=lambda: self._add(retries=1))
    except SearchError:
      self._add(failures=1)
      raise

  def _post(self, body: bytes) -> bytes:
    """One HTTP attempt -> the response body; SearchUnavailable when worth retrying."""
    if self._bucket is not None:
      self._bucket.acquire()
    request = urllib.request.Request(self.url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json"})
    with self._sem:
      self._add(requests=1, in_flight=1)
      try:
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
          return response.read()
      except urllib.error.HTTPError as e:
        detail = _error_detail(e)
        if 500 <= e.code or e.code == 429:
          raise SearchUnavailable(f"{self.url}: HTTP {e.code}: {detail}", e.code) from None
        raise SearchRequestError(f"{self.url}: HTTP {e.code}: {detail}", e.code) from None
      except TimeoutError as e:
        raise SearchTimeout(f"{self.url}: timed out after {self.timeout_s} s ({e})") from None
      except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
          raise SearchTimeout(f"{self.url}: timed out after {self.timeout_s} s") from None
        raise SearchUnavailable(f"{self.url}: {e.reason}") from None
      except (ConnectionError, HTTPException, OSError) as e:
        raise SearchUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
      finally:
        self._add(in_flight=-1)


def _error_detail(e: urllib.error.HTTPError) -> str:
  try:
    payload = json.loads(e.read().decode("utf-8"))
    return str(payload.get("error", payload)) if isinstance(payload, dict) else str(payload)
  except Exception:  # noqa: BLE001 -- not our server, or not JSON
    return e.reason if isinstance(e.reason, str) else str(e)


def _parse_response(body: bytes, n: int) -> list[list[Passage]]:
  """A `/retrieve` response (with or without scores) -> passages; SearchError if malformed."""
  try:
    result = json.loads(body.decode("utf-8"))["result"]
    if not isinstance(result, list) or len(result) != n:
      raise ValueError(f"'result' holds {len(result) if isinstance(result, list) else result!r}"
                       f" lists for {n} queries")
    out = []
    for docs in result:
      row = []
      for item in docs:
        doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
        row.append(Passage(str(doc["id"]), str(doc["contents"]),
                           None if score is None else float(score)))
      out.append(row)
    return out
  except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as e:
    raise SearchError(f"malformed /retrieve response: {type(e).__name__}: {e}") from None


class LocalSearch:
  """The same `search` as SearchClient, in process: a Retriever over an index folder."""

  def __init__(self, index, topk: int = 3, encoder=None):
    self.retriever = index if isinstance(index, Retriever) else Retriever(index, encoder)
    self.topk = topk

  def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
    return self.retriever.retrieve(_check_queries(queries), topk or self.topk)
