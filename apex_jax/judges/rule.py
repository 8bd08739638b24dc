"""Rule-based answer scoring: exact match and token F1 after the usual normalisation.

The normalisation is SQuAD's (HotpotQA's and 2WikiMultiHopQA's official evaluators use the same):
lower case, drop punctuation, drop the articles a/an/the, collapse white space. A prediction is
scored against every gold answer and the best score is kept.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
  text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(answers: str | Sequence[str]) -> list[str]:
  golds = [answers] if isinstance(answers, str) else list(answers)
  if not golds:
    raise ValueError("answers is empty: give at least one gold answer")
  return golds


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
  """1.0 when the normalised prediction equals a normalised gold answer, else 0.0."""
  pred = normalize_answer(prediction)
  return float(any(pred == normalize_answer(g) for g in _golds(answers)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
  # HotpotQA's evaluator: yes/no/noanswer only match themselves exactly.
  special = {"yes", "no", "noanswer"}
  if (" ".join(pred_tokens) in special or " ".join(gold_tokens) in special) and \
      pred_tokens != gold_tokens:
    return 0.0
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def f1(prediction: str, answers: str | Sequence[str]) -> float:
  """Token-level F1 of the normalised strings, best over the gold answers."""
  pred = normalize_answer(prediction).split()
  return max(_f1(pred, normalize_answer(g).split()) for g in _golds(answers))
