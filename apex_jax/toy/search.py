"""An in-process word-overlap search over a list of passages (no index, no model): the toy's
search tool, with the `Searcher` interface of `apex_jax.tools` (LocalSearch, SearchClient).

score(q, p) = sum over the distinct words w of q that occur in p of idf(w),
idf(w) = log(1 + N / df(w)); ties go to the earlier passage. The world's names are invented
words used once each, so a query naming an entity ranks that entity's passage (and the passages
that mention it) first, which is what the gold chains' queries rely on.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from apex_jax.tools.passages import Passage

_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
  return set(_WORD.findall(text.lower()))


class WordSearch:
  def __init__(self, passages: Sequence[Passage], topk: int = 3):
    if not passages:
      raise ValueError("WordSearch: no passages")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
      raise ValueError(f"WordSearch.topk must be an integer >= 1, got {topk!r}")
    self.passages, self.topk = list(passages), topk
    self._words = [words(p.contents) for p in self.passages]
    df: dict[str, int] = {}
    for ws in self._words:
      for w in ws:
        df[w] = df.get(w, 0) + 1
    n = len(self.passages)
    self._idf = {w: math.log(1.0 + n / d) for w, d in df.items()}
    # word -> rows that contain it, so a query touches only its words' passages
    self._rows: dict[str, list[int]] = {}
    for i, ws in enumerate(self._words):
      for w in ws:
        self._rows.setdefault(w, []).append(i)

  def scores(self, query: str) -> np.ndarray:
    out = np.zeros(len(self.passages), np.float64)
    for w in words(query):
      for i in self._rows.get(w, ()):
        out[i] += self._idf[w]
    return out

  def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
    if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
      raise ValueError(f"WordSearch.search takes a list of query strings, got {queries!r:.80}")
    k = min(topk or self.topk, len(self.passages))
    out = []
    for q in queries:
      s = self.scores(q)
      order = np.argsort(-s, kind="stable")[:k]  # stable: ties keep corpus order
      out.append([Passage(self.passages[i].id, self.passages[i].contents, float(s[i]))
                  for i in order])
    return out
