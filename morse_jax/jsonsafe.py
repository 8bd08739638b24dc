"""JSON from model output, read without crashing: every failure is a `json.JSONDecodeError`.

`json.loads` itself can raise more than JSONDecodeError on hostile text: RecursionError on deeply
nested `[` / `{` (about 1000 levels), a plain ValueError on an integer longer than Python's
int-string limit (4300 digits). `loads` turns both into JSONDecodeError (a ValueError), and
refuses nesting deeper than `MAX_DEPTH` before decoding, so callers that catch JSONDecodeError
(or ValueError) are complete. It also refuses the non-standard constants NaN / Infinity /
-Infinity (`allow_nan=False`), which `json` accepts by default and which must never become a
score. Run time is linear in the text's length.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 100  # nesting of objects and lists; model replies need a handful

_STRUCTURE = re.compile(r'[\[\]{}"]')


def nesting_depth(text: str, start: int = 0, end: int | None = None) -> tuple[int, int]:
  """(deepest nesting of `[` / `{` outside strings in text[start:end], where it first reached
  that depth). Unbalanced text is read as far as it goes (a stray closer counts as nothing)."""
  end = len(text) if end is None else end
  depth = deepest = 0
  at = start
  i = start
  while True:
    m = _STRUCTURE.search(text, i, end)
    if m is None:
      return deepest, at
    c, i = m.group(), m.end()
    if c == '"':  # skip the string: the next quote not escaped by an odd run of backslashes
      j = i
      while True:
        k = text.find('"', j, end)
        if k < 0:
          return deepest, at
        b = k - 1
        while b >= j and text[b] == "\\":
          b -= 1
        if (k - 1 - b) % 2 == 0:
          break
        j = k + 1
      i = k + 1
    elif c in "[{":
      depth += 1
      if depth > deepest:
        deepest, at = depth, m.start()
    else:
      depth = max(depth - 1, 0)


def _reject_constant(name: str):
  raise ValueError(f"{name} is not a JSON number")


# shared like json's own default decoder (its scanner keeps no state between calls)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def raw_decode(text: str, start: int = 0, max_depth: int | None = MAX_DEPTH,
               end: int | None = None):
  """`json.JSONDecoder().raw_decode(text, start)` that raises only JSONDecodeError (see the module
  docstring); positions in the error are positions in `text`. The nesting check looks at
  text[start:end] (give `end` when the value is known to end there, to keep repeated calls
  linear); max_depth None leaves only the decoder's own recursion limit."""
  if max_depth is not None and (text.count("[", start, end) + text.count("{", start, end)
                                > max_depth):
    deepest, at = nesting_depth(text, start, end)
    if deepest > max_depth:
      # reported at `start`: the error position is never past text that decoded cleanly
      raise json.JSONDecodeError(f"nested deeper than {max_depth} levels (at char {at})", text,
                                 start)
  try:
    return _DECODER.raw_decode(text, start)
  except json.JSONDecodeError:
    raise
  except (ValueError, RecursionError) as e:  # int too long, NaN/Infinity, deep nesting
    raise json.JSONDecodeError(f"{type(e).__name__}: {str(e)[:120]}", text, start) from None


def loads(text: str, max_depth: int = MAX_DEPTH):
  """`json.loads(text)` that raises only JSONDecodeError (see the module docstring)."""
  if not isinstance(text, str):
    raise TypeError(f"JSON text must be a string, got {type(text).__name__}")
  begin = len(text) - len(text.lstrip(" \t\n\r"))
  obj, end = raw_decode(text, begin, max_depth)
  rest = len(text) - len(text[end:].lstrip(" \t\n\r"))
  if rest != len(text):
    raise json.JSONDecodeError("Extra data", text, rest)
  return obj
