"""Answer accuracy of a prediction set: exact match and token F1, overall and per group.

As the official HotpotQA evaluator does, every labelled example counts: a question without a
prediction scores 0 on both (counted in "missing"); predictions for unknown ids are ignored
(counted in "extra"). Each example scores its best over its gold aliases
(`apex_jax.judges.rule`):
  em = (1/n) sum_i max_g EM(pred_i, g),   f1 = (1/n) sum_i max_g F1(pred_i, g).
"""

from __future__ import annotations

import collections
from typing import Mapping, Sequence

from apex_jax.datasets.records import DatasetError, QAExample
from apex_jax.judges import rule


def _summary(scores: Sequence[tuple[float, float]]) -> dict:
  n = len(scores)
  return {"em": sum(s[0] for s in scores) / n if n else 0.0,
          "f1": sum(s[1] for s in scores) / n if n else 0.0, "n": n}


def evaluate(predictions: Mapping[str, str], examples: Sequence[QAExample]) -> dict:
  """{"em", "f1", "n", "missing", "extra", "per_category": {c: {em, f1, n}},
  "per_hops": {h: {em, f1, n}}, "f1_per_question": {id: f1}} over `examples`, which must all be
  labelled (the per-question F1 pairs two systems' runs on the same questions: apex_jax.seeds)."""
  for qid, prediction in predictions.items():
    if not isinstance(prediction, str):
      raise DatasetError(f"prediction for id {qid!r} must be a string, got "
                         f"{type(prediction).__name__}")
  ids = set()
  scores, by_category, by_hops = [], collections.defaultdict(list), collections.defaultdict(list)
  per_question = {}
  missing = 0
  for example in examples:
    if not example.labelled:
      raise DatasetError(f"example {example.id!r} has no gold answer (an unlabelled split "
                         "cannot be scored)")
    if example.id in ids:
      raise DatasetError(f"example id {example.id!r} appears twice")
    ids.add(example.id)
    if example.id in predictions:
      prediction = predictions[example.id]
      score = (rule.exact_match(prediction, example.answers), rule.f1(prediction, example.answers))
    else:
      missing += 1
      score = (0.0, 0.0)
    scores.append(score)
    per_question[example.id] = score[1]
    by_category[example.category].append(score)
    by_hops[example.hops].append(score)
  out = _summary(scores)
  out.update(missing=missing, extra=sum(1 for qid in predictions if qid not in ids),
             per_category={c: _summary(s) for c, s in sorted(by_category.items())},
             per_hops={h: _summary(s) for h, s in sorted(by_hops.items())},
             f1_per_question=per_question)
  return out
