"""Blocks of model text (``` fences, <tag>...</tag>) found in time linear in the text's length.

The regex way of writing these, `re.findall(r"```(\\w*)\\s*(.*?)```", text, re.DOTALL)` or
`re.findall(r"<a>(.*?)</a>", text, re.DOTALL)`, is quadratic on a reply the model can write: with
no closing fence or tag, the engine scans to the end once for every way the head (`\\s*` before
`.*?`, which also matches spaces) can end, or once for every opening tag. The scans here give
the same matches: a closing marker searched for once from each opening, and the search stopped
for good once no closing marker is left (none can follow a later opening either).
"""

from __future__ import annotations

import re

FENCE = "```"


def fenced(text: str, head: re.Pattern) -> list[tuple[re.Match, str]]:
  """(head match, body) of every fenced block, as
  `re.findall("```" + head.pattern + "(.*?)```", text, re.DOTALL)` finds them.

  `head` is matched right after the opening ``` and must match (possibly empty) and never take
  a backtick: then its greedy match is the one the combined regex settles on, as a shorter one
  leaves the body's start on a character that cannot begin the closing fence."""
  out = []
  i = 0
  while True:
    start = text.find(FENCE, i)
    if start < 0:
      return out
    head_match = head.match(text, start + len(FENCE))
    end = text.find(FENCE, head_match.end())
    if end < 0:
      return out
    out.append((head_match, text[head_match.end():end]))
    i = end + len(FENCE)


def tag_spans(text: str, open_: re.Pattern, close: re.Pattern) -> list[tuple[re.Match, re.Match]]:
  """(opening, closing) of each block `open_ .*? close` (DOTALL) in `text`, left to right, as
  `re.finditer` of the combined pattern finds them (each opening takes the first closing after
  it; openings inside a block are its text)."""
  out = []
  i = 0
  while True:
    opening = open_.search(text, i)
    if opening is None:
      return out
    closing = close.search(text, opening.end())
    if closing is None:
      return out
    out.append((opening, closing))
    i = closing.end()


def between(text: str, open_: str, close: str) -> list[str]:
  """`re.findall(re.escape(open_) + "(.*?)" + re.escape(close), text, re.DOTALL)`: the text of
  every `open_ ... close` block."""
  spans = tag_spans(text, re.compile(re.escape(open_)), re.compile(re.escape(close)))
  return [text[o.end():c.start()] for o, c in spans]


def first_in_line(text: str, open_: str, close: str) -> str | None:
  """`re.search(re.escape(open_) + "(.*?)" + re.escape(close), text)` without DOTALL: the text
  of the first `open_ ... close` within one line, or None. An opening with no `close` before the
  line's end is passed over with every later opening on that line, so each character is read
  once."""
  i = 0
  while True:
    start = text.find(open_, i)
    if start < 0:
      return None
    body = start + len(open_)
    end, newline = text.find(close, body), text.find("\n", body)
    if end >= 0 and (newline < 0 or end < newline):
      return text[body:end]
    if newline < 0:
      return None
    i = newline + 1
