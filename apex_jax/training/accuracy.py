"""R_acc: how the executor's and planner's answers are scored against the gold answers.

  rule   `RuleAccuracy("em" | "f1")`: exact match or token F1 (judges/rule.py), no model call;
  judge  `JudgedAccuracy(LlmJudge(chat), fallback="em")`: the paper's LLM judge (the authors'
         `extra_info["acc_score"]` is a binary judge verdict, J-Ding519/APEx
         Executor-Train/Train/local_search/mmsearch.py): 1 correct, 0 incorrect or not attempted.
         A judgement the judge could not give (a reply it cannot parse, an empty one, a failed
         call) is scored by the rule metric `fallback` instead and counted (`judge_fallbacks`).

Both score a batch of `AccuracyItem`s in one call (the judge: one batched backend call) and keep
the counts of their last call in `metrics` (a rollout copies them into the stage's metrics).
An item without an answer (the run never answered) scores 0 without a judge call.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Protocol, Sequence

from apex_jax.judges import rule

RULES = ("em", "f1")


@dataclasses.dataclass(frozen=True)
class AccuracyItem:
  question: str
  answer: str | None  # None: no answer was given
  golds: Sequence[str]


def rule_accuracy(answer: str | None, golds: Sequence[str], metric: str = "em") -> float:
  """The rule judge's score of an answer against its gold aliases; no answer scores 0."""
  if metric not in RULES:
    raise ValueError(f"accuracy metric {metric!r} not in {RULES}")
  if answer is None or not golds:
    return 0.0
  return (rule.exact_match if metric == "em" else rule.f1)(answer, list(golds))


class Accuracy(Protocol):
  metrics: dict[str, float]

  def score_many(self, items: Sequence[AccuracyItem]) -> list[float]: ...


@dataclasses.dataclass
class RuleAccuracy:
  metric: str = "em"
  metrics: dict = dataclasses.field(default_factory=dict, init=False)

  def __post_init__(self):
    if self.metric not in RULES:
      raise ValueError(f"RuleAccuracy.metric {self.metric!r} not in {RULES}")

  def score_many(self, items: Sequence[AccuracyItem]) -> list[float]:
    self.metrics = {}
    return [rule_accuracy(it.answer, it.golds, self.metric) for it in items]


@dataclasses.dataclass
class JudgedAccuracy:
  """R_acc from an `LlmJudge` (any chat backend); `fallback` scores what it could not judge.

  metrics of the last call: judge_calls (answers sent to the judge), judge_fallbacks (of
  those, scored by the rule metric). `totals` sums them over every call."""

  judge: Any  # apex_jax.judges.LlmJudge
  fallback: str = "em"
  metrics: dict = dataclasses.field(default_factory=dict, init=False)
  totals: collections.Counter = dataclasses.field(default_factory=collections.Counter,
                                                  init=False)

  def __post_init__(self):
    if self.fallback not in RULES:
      raise ValueError(f"JudgedAccuracy.fallback {self.fallback!r} not in {RULES}")

  def score_many(self, items: Sequence[AccuracyItem]) -> list[float]:
    out = [0.0] * len(items)
    ask = [i for i, it in enumerate(items) if it.answer is not None and it.answer.strip()
           and it.golds]
    judged = self.judge.judge_many([(items[i].question, list(items[i].golds), items[i].answer)
                                    for i in ask])
    if len(judged) != len(ask):
      raise RuntimeError(f"judge returned {len(judged)} judgements for {len(ask)} answers")
    fallbacks = 0
    for i, j in zip(ask, judged):
      if j.failure is None:
        out[i] = float(j.score)
      else:  # counted by the judge under its failure kind; scored by the rule here
        fallbacks += 1
        out[i] = rule_accuracy(items[i].answer, items[i].golds, self.fallback)
    self.metrics = {"judge_calls": float(len(ask)), "judge_fallbacks": float(fallbacks)}
    self.totals.update(judge_calls=len(ask), judge_fallbacks=fallbacks)
    return out


def as_accuracy(value: "str | Accuracy", owner: str) -> "Accuracy":
  """A rule name ("em" / "f1") -> RuleAccuracy; a scorer passes through."""
  if isinstance(value, str):
    if value not in RULES:
      raise ValueError(f"{owner}.accuracy {value!r} not in {RULES}")
    return RuleAccuracy(value)
  if not hasattr(value, "score_many"):
    raise ValueError(f"{owner}.accuracy must be 'em', 'f1' or a scorer with score_many, got "
                     f"{value!r}")
  return value
