"""LLM-as-judge correctness with gold answers: (question, golds, prediction) -> verdict + score.

The prompt is the APEx authors' (`prompts.CORRECTNESS`, SimpleQA's grader): the judge answers
A (correct), B (incorrect) or C (not attempted). Their parsing (`judge_answer2`, J-Ding519/APEx
TTRL/TTRL-nogt/local_search/mmsearch_skill.py): an empty prediction is incorrect without asking;
"A" is correct, anything else incorrect; on a connection error they fall back to "the gold answer
is a substring of the prediction" (`on_unavailable="substring"` here).

We read replies more leniently (`replies.find_verdict`: JSON objects, "Verdict: A", "**B**",
the words CORRECT / INCORRECT / NOT_ATTEMPTED, a `{"correct": true, "reason": ...}` object), and a
reply we cannot read is a counted failure scored `failure_score`, never a crash:
  score = 1 (correct), 0 (incorrect), not_attempted_score, or failure_score.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from apex_jax.judges import prompts, replies, rule
from apex_jax.judges.chat import ChatBackend, JudgeError

VERDICTS = ("correct", "incorrect", "not_attempted")
FAILURES = replies.BACKEND_FAILURES + ("empty_reply", "unparseable")
_CHOICES = {"A": "correct", "B": "incorrect", "C": "not_attempted", "CORRECT": "correct",
            "INCORRECT": "incorrect", "NOT ATTEMPTED": "not_attempted"}
_FALLBACKS = ("score", "substring")


@dataclasses.dataclass(frozen=True)
class LlmJudgeConfig:
  max_tokens: int = 64  # the reply is one letter; room for a short preamble or JSON
  temperature: float = 0.0  # the authors' judge_answer2
  failure_score: float = 0.0
  not_attempted_score: float = 0.0
  on_unavailable: str = "score"  # or "substring": the authors' fallback when the judge is down
  system_prompt: str | None = None  # Inference/APEx-noTTRL/judge.py adds one; training does not

  def __post_init__(self):
    if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
      raise ValueError(f"LlmJudgeConfig.max_tokens must be a positive integer, "
                       f"got {self.max_tokens!r}")
    if self.temperature < 0:
      raise ValueError(f"LlmJudgeConfig.temperature must be >= 0, got {self.temperature!r}")
    for name in ("failure_score", "not_attempted_score"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"LlmJudgeConfig.{name} must be in [0, 1], got {getattr(self, name)!r}")
    if self.on_unavailable not in _FALLBACKS:
      raise ValueError(f"LlmJudgeConfig.on_unavailable must be one of {_FALLBACKS}, "
                       f"got {self.on_unavailable!r}")


@dataclasses.dataclass(frozen=True)
class Judgement:
  verdict: str | None  # one of VERDICTS; None when the judge failed
  score: float
  reason: str
  failure: str | None = None  # one of FAILURES
  raw: str | None = None  # the judge's reply, None when there was none


def format_golds(answers: str | Sequence[str]) -> str:
  """The gold target line: one answer as is, several joined by ' OR '."""
  golds = [answers] if isinstance(answers, str) else [str(a) for a in answers]
  if not golds:
    raise ValueError("answers is empty: give at least one gold answer")
  return " OR ".join(golds)


class LlmJudge:
  """Correctness judge over any ChatBackend; `failures.snapshot()` counts failures by kind."""

  def __init__(self, backend: ChatBackend, config: LlmJudgeConfig = LlmJudgeConfig()):
    self.backend, self.config = backend, config
    self.failures = replies.FailureCounts(FAILURES)

  def messages(self, question: str, answers: str | Sequence[str], prediction: str) -> list[dict]:
    text = prompts.CORRECTNESS.format(question=question, correct_answer=format_golds(answers),
                                      response=prediction)
    system = [{"role": "system", "content": self.config.system_prompt}] \
        if self.config.system_prompt else []
    return system + [{"role": "user", "content": text}]

  def judge(self, question: str, answers: str | Sequence[str], prediction: str) -> Judgement:
    return self.judge_many([(question, answers, prediction)])[0]

  def judge_many(self, items: Sequence[tuple[str, str | Sequence[str], str]]) -> list[Judgement]:
    """Judgements of (question, golds, prediction) items, asked in one batched backend call."""
    out: list[Judgement | None] = [None] * len(items)
    ask = []
    for i, (question, answers, prediction) in enumerate(items):
      format_golds(answers)  # a programming error, not model output: raise before any call
      if not prediction.strip():
        out[i] = Judgement("incorrect", 0.0, "empty prediction")
      else:
        ask.append(i)
    answers_of = replies.ask_all(self.backend, [self.messages(*items[i]) for i in ask],
                                 max_tokens=self.config.max_tokens,
                                 temperature=self.config.temperature, failures=self.failures)
    for i, reply in zip(ask, answers_of):
      failed = isinstance(reply, JudgeError)
      out[i] = self._failed(reply, *items[i]) if failed else self.parse(reply)
    return out  # type: ignore[return-value]

  def _failed(self, error: JudgeError, question, answers, prediction) -> Judgement:
    # Already counted by ask_all under the backend's failure kind.
    kind = replies.backend_failure_kind(error)
    if self.config.on_unavailable == "substring":
      pred = rule.normalize_answer(prediction)
      hit = any(rule.normalize_answer(g) in pred
                for g in ([answers] if isinstance(answers, str) else answers))
      return Judgement(None, float(hit), f"judge failed ({error}); substring fallback", kind)
    return Judgement(None, self.config.failure_score, f"judge failed: {error}", kind)

  def parse(self, reply: str) -> Judgement:
    """A reply -> Judgement; an unreadable one is counted and scored failure_score."""
    body = replies.strip_think(reply)
    if not body:
      self.failures.add("empty_reply", repr(reply[:80]))
      return Judgement(None, self.config.failure_score, "empty reply", "empty_reply", reply)
    verdict, _ = replies.find_verdict(body, _CHOICES)
    obj = replies.find_json_object(body)
    if verdict is None and obj is not None:
      flag = obj.get("correct", obj.get("is_correct"))
      if isinstance(flag, bool):
        verdict = "correct" if flag else "incorrect"
    if verdict is None:
      self.failures.add("unparseable", body[:120])
      return Judgement(None, self.config.failure_score, f"unparseable reply: {body[:80]!r}",
                       "unparseable", reply)
    score = {"correct": 1.0, "incorrect": 0.0,
             "not_attempted": self.config.not_attempted_score}[verdict]
    return Judgement(verdict, score, replies.find_reason(body), None, reply)
