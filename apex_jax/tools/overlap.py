"""In-process term-overlap searches over a list of passages (no index, no model): the search
tools of the synthetic world (config `search.kind` word / ngram) and of the toy's corpus, with
the `Searcher` interface of `apex_jax.tools.search` (LocalSearch, SearchClient).

score(q, p) = sum over the distinct terms t of q that occur in p of idf(t),
idf(t) = log(1 + N / df(t)); ties go to the earlier passage.
- `WordSearch`: the terms are words. The world's names are invented words used once each, so a
  query naming an entity ranks that entity's passage (and the passages that mention it) first,
  which is what the gold chains' queries rely on.
- `NgramSearch`: the terms are character trigrams of each word padded with a space (" lu",
  "lun", ..., "is "), as in fuzzy TF-IDF retrieval: a query that misspells a name
  ("Purkur Denkur" for "Purkir Denos") still shares most of its trigrams with the passage, as
  it would still land near it under a dense retriever.
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


def trigrams(text: str) -> set[str]:
  return {f" {w} "[i:i + 3] for w in words(text) for i in range(len(w))}


class WordSearch:
  terms = staticmethod(words)

  def __init__(self, passages: Sequence[Passage], topk: int = 3):
    name = type(self).__name__
    if not passages:
      raise ValueError(f"{name}: no passages")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
      raise ValueError(f"{name}.topk must be an integer >= 1, got {topk!r}")
    self.passages, self.topk = list(passages), topk
    self._terms = [self.terms(p.contents) for p in self.passages]
    df: dict[str, int] = {}
    for ts in self._terms:
      for w in ts:
        df[w] = df.get(w, 0) + 1
    n = len(self.passages)
    self._idf = {w: math.log(1.0 + n / d) for w, d in df.items()}
    # term -> rows that contain it, so a query touches only its terms' passages
    self._rows: dict[str, list[int]] = {}
    for i, ts in enumerate(self._terms):
      for w in ts:
        self._rows.setdefault(w, []).append(i)

  def scores(self, query: str) -> np.ndarray:
    # fsum, exactly rounded: the terms come from a set, whose order PYTHONHASHSEED sets, and a
    # float sum in another order differs in the last bits, so two passages that tie (the same
    # idfs) were ordered by the process's hash seed, not by the corpus
    hits: dict[int, list[float]] = {}
    for w in self.terms(query):
      for i in self._rows.get(w, ()):
        hits.setdefault(i, []).append(self._idf[w])
    out = np.zeros(len(self.passages), np.float64)
    for i, idfs in hits.items():
      out[i] = math.fsum(idfs)
    return out

  def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
    if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
      raise ValueError(f"{type(self).__name__}.search takes a list of query strings, got "
                       f"{queries!r:.80}")
    k = min(topk or self.topk, len(self.passages))
    out = []
    for q in queries:
      s = self.scores(q)
      order = np.argsort(-s, kind="stable")[:k]  # stable: ties keep corpus order
      out.append([Passage(self.passages[i].id, self.passages[i].contents, float(s[i]))
                  for i in order])
    return out


class NgramSearch(WordSearch):
  terms = staticmethod(trigrams)
