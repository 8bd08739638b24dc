"""Shared pieces of the LLM judges: reading a judge's reply and counting what went wrong.

A judge's reply is model output: it may think first (`<think>...</think>`), wrap JSON in prose or
fences, or say nothing usable. Nothing here raises on a reply; callers turn a miss into a counted
failure with a defined score (DESIGN.md section 6).
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import math
import re
import threading
from typing import Sequence

from apex_jax.judges.chat import (ChatBackend, JudgeError, JudgeRequestError, JudgeResponseError,
                                  complete_many)
from apex_jax.memory.schema import MemoryBankError
from apex_jax.memory.skills import extract_json_object

log = logging.getLogger(__name__)

# Backend failure kinds, shared by every judge; each judge adds its own parse failure kinds.
BACKEND_FAILURES = ("unavailable", "rejected", "bad_response")
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# The patterns below read runs of blanks and markdown stars possessively (`\s*+`, `\**+`):
# backtracking into `\s*\**\s*` tries every split of a run, quadratic on a long one, and
# never finds another match, as what follows each run (a digit or sign, ':', '/') cannot be a
# blank or a star (find_reason reads what follows its runs itself).
_JSON_NUMBER = re.compile(rf"\s*+{_NUMBER}\s*+(?:/\s*+10)?\s*+")  # a JSON field "7 / 10"
_REASON = re.compile(r"reason\**+\s*+:", re.IGNORECASE)
_REASON_LEAD = re.compile(r"\s*+\**+\s*+")


@functools.lru_cache(maxsize=16)
def _labelled_number(label: str) -> re.Pattern:
  """`label: 7`, `**label**: 7`, `label = 7`, case-insensitive."""
  return re.compile(rf"{label}\**+\s*+[:=]\s*+\**+\s*+({_NUMBER})", re.I)


def strip_think(text: str) -> str:
  """The text after the last `</think>` (or `<think>` left open), trimmed.

  The authors' `extract_after_think` (J-Ding519/APEx TTRL/TTRL-nogt/local_search/mmsearch_skill.py)
  cuts at the later of the two tags the same way."""
  cut = max(text.rfind("</think>"), text.rfind("<think>"))
  if cut >= 0:
    text = text[cut:].split(">", 1)[1]
  return text.replace("<|im_end|>", "").strip()


def find_json_object(text: str) -> dict | None:
  """The first JSON object anywhere in the reply (fenced or in prose), or None. A judge reads one
  reply several times (score, reason, verdict): the last replies' objects are cached, and each
  caller gets its own copy."""
  found = _json_object(text)
  return copy.deepcopy(found) if found is not None else None


@functools.lru_cache(maxsize=64)
def _json_object(text: str) -> dict | None:
  try:
    return extract_json_object(text)
  except MemoryBankError:
    return None


def clear_cache() -> None:
  """Forgets the cached objects of recent replies (for timing a parse, not a lookup)."""
  _json_object.cache_clear()


def find_number(text: str, label: str = "score") -> tuple[float | None, str]:
  """A number the reply gives for `label`, and how it was found.

  Tried in order: a JSON object's `label` field; `label: 7` (markdown bold, "- " bullets and a
  "/10" suffix allowed); `7/10`; the reply being a bare number. Returns (None, "") when none.
  A number that is not finite as a float (NaN, Infinity, 400 digits) is never returned: the
  method that found it counts as a miss, so NaN / inf never become a score."""
  obj = find_json_object(text)
  if obj is not None:
    value = obj.get(label)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      number = finite_number(value)
      if number is not None:
        return number, "json"
    if isinstance(value, str) and _JSON_NUMBER.fullmatch(value):
      number = finite_number(re.match(rf"\s*({_NUMBER})", value).group(1))
      if number is not None:
        return number, "json"
  for how, match in (
      ("label", lambda: _labelled_number(label).search(text)),
      ("ratio", lambda: re.search(rf"(?<![\w.])({_NUMBER})\s*/\s*10\b", text)),
      ("bare", lambda: re.fullmatch(rf"[\s*`\"']*({_NUMBER})[\s*`\"'.]*", text))):
    found = match()
    if found:
      number = finite_number(found.group(1))
      if number is not None:
        return number, how
  return None, ""


def finite_number(value) -> float | None:
  """float(value) when that is a finite number, else None (never raises)."""
  try:
    number = float(value)
  except (OverflowError, ValueError):  # an int too large for a float
    return None
  return number if math.isfinite(number) else None


def find_reason(text: str) -> str:
  """A JSON `reason` field, else the text after `Reason:`, else ''."""
  obj = find_json_object(text)
  if obj is not None and isinstance(obj.get("reason"), str):
    return obj["reason"].strip()
  label = _REASON.search(text)
  if label is None:
    return ""
  lead = _REASON_LEAD.match(text, label.end())
  if lead.end() < len(text):
    return text[lead.end():].strip()
  # nothing after the blanks and stars: the regex `reason\**\s*:\s*\**\s*(.+)` gave its
  # `(.+)` the run's last character, '' once stripped unless the run ends in a star
  return "*" if text.endswith("*", label.end()) else ""


class FailureCounts:
  """Thread-safe counts of failures by kind (a judge is shared by rollout threads)."""

  def __init__(self, kinds: Sequence[str]):
    self.kinds = tuple(kinds)
    self._counts: collections.Counter = collections.Counter({k: 0 for k in self.kinds})
    self._lock = threading.Lock()

  def add(self, kind: str, detail: str = "") -> None:
    if kind not in self.kinds:
      raise ValueError(f"unknown failure kind {kind!r}; known: {self.kinds}")
    with self._lock:
      self._counts[kind] += 1
    log.warning("judge failure %s: %s", kind, detail[:200])

  def snapshot(self) -> dict[str, int]:
    with self._lock:
      return dict(self._counts)

  @property
  def total(self) -> int:
    with self._lock:
      return sum(self._counts.values())


def ask_all(backend: ChatBackend, conversations: Sequence[list[dict]], *, max_tokens: int,
            temperature: float, failures: FailureCounts) -> list[str | JudgeError]:
  """Replies of all conversations in one batched backend call; a failed conversation keeps its
  JudgeError, counted in `failures` under `backend_failure_kind`."""
  if not conversations:
    return []
  out = complete_many(backend, conversations, max_tokens=max_tokens, temperature=temperature)
  for reply in out:
    if isinstance(reply, JudgeError):
      failures.add(backend_failure_kind(reply), str(reply))
  return out


def backend_failure_kind(error: JudgeError) -> str:
  if isinstance(error, JudgeRequestError):
    return "rejected"
  return "bad_response" if isinstance(error, JudgeResponseError) else "unavailable"


_VERDICT_KEYS = ("verdict", "grade", "judgement", "judgment", "answer", "decision", "result")
_LABELLED = re.compile(
    r"^\W*(?:final\s+)?(?:verdict|grade|judge?ment|answer|decision)\W*[:=]\s*(.+)$", re.I)
_LEADING = re.compile(r"^\W*([A-Za-z])\s*[:.)\-–]")


_LEAD = frozenset("*`\"'([")
_TRAIL = frozenset("*`\"'.:)]!")


def _token(text: str) -> str:
  """Upper case without surrounding markdown, quotes, brackets and end punctuation (a scan, not
  a regex: `[...]+$` is quadratic on a long run of those characters not at the end)."""
  i, j = 0, len(text)
  while i < j and (text[i].isspace() or text[i] in _LEAD):
    i += 1
  while j > i and (text[j - 1].isspace() or text[j - 1] in _TRAIL):
    j -= 1
  return text[i:j].upper().replace("_", " ")


def find_verdict(text: str, choices: dict[str, str]) -> tuple[str | None, str]:
  """The verdict a reply gives, and how it was found.

  `choices` maps tokens (upper case, `_` read as a space: "A", "NOT ATTEMPTED") to verdicts.
  Tried in order: a JSON object's verdict/grade/judgement/answer field; the whole reply being one
  token ("A", "**B**.", "Correct"); a labelled line ("Verdict: A", "Final answer: B"); the first
  or last line being a token or starting with a letter token ("A: CORRECT"). Letters are never
  looked for inside prose ("A correct answer..." is not a verdict). Returns (None, "") on a miss.
  """
  body = strip_think(text)
  obj = find_json_object(body)
  if obj is not None:
    for key in _VERDICT_KEYS:
      if isinstance(obj.get(key), str) and _token(obj[key]) in choices:
        return choices[_token(obj[key])], "json"
  if _token(body) in choices:
    return choices[_token(body)], "exact"
  lines = [line for line in body.splitlines() if line.strip()]
  for line in lines:
    labelled = _LABELLED.match(line)
    if labelled:
      value = labelled.group(1)
      for candidate in (_token(value), _token(value.split()[0]) if value.split() else ""):
        if candidate in choices:
          return choices[candidate], "label"
  for line in lines[:1] + lines[-1:]:
    if _token(line) in choices:
      return choices[_token(line)], "line"
    leading = _LEADING.match(line)
    if leading and leading.group(1).upper() in choices:
      return choices[leading.group(1).upper()], "line"
  return None, ""
