"""The no-ground-truth judge of APEx's test-time RL: three evaluators and a final arbiter.

As the authors run it (`evaluate_agent_without_gt`, J-Ding519/APEx
TTRL/TTRL-nogt/local_search/judge_nogt.py, used by `compute_score` in mmsearch_skill.py):
1. three evaluators read (question, trajectory, final output) and reply "- Score: 1-10 /
   - Reason: ...": reasoning (temperature 0.1), sourcing (0.1), validity (0.1, no trajectory);
2. the arbiter reads the same inputs plus the three replies verbatim, labelled with importance
   weights 0.5 / 0.3 / 0.2, and answers one letter at temperature 0: A (the answer is correct) or
   B (incorrect). It judges one answer; it does not choose between two answers;
3. arbiter = 1 if correct else 0, and the training reward is R_nogt = 0.9 * arbiter + 0.1 * format
   (built by the training code, not here). The weights enter only through the arbiter's prompt.

`reward="arbiter"` (default) is that. `reward="weighted"` is an option of ours that uses the
evaluators' scores directly: weighted = (sum_k w_k s_k - 1) / 9, in [0, 1] for scores in [1, 10].
Both values are always reported.

Failures never raise. An evaluator whose call or reply fails scores `failed_evaluator_score` and
the arbiter sees `failed_feedback` in its place (the authors' client returns "Error"); an arbiter
whose verdict cannot be read scores `failed_arbiter_score`. The authors read the verdict as
"A" anywhere in the reply with dots and spaces removed (`arbiter_parse="authors"`); by default we
read it with `replies.find_verdict` and count what we cannot read. Scores outside [1, 10] are
rejected (counted, scored as failed) or, with `out_of_range="clip"`, clipped and counted.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from apex_jax.judges import prompts, replies
from apex_jax.judges.chat import ChatBackend, JudgeError

EVALUATORS = ("reasoning", "sourcing", "validity")
EVALUATOR_FAILURES = replies.BACKEND_FAILURES + ("empty_reply", "no_score", "score_out_of_range",
                                                 "score_clipped")
ARBITER_FAILURES = replies.BACKEND_FAILURES + ("empty_reply", "unparseable_verdict")
_CHOICES = {"A": "correct", "B": "incorrect", "CORRECT": "correct", "INCORRECT": "incorrect"}


@dataclasses.dataclass(frozen=True)
class NoGtConfig:
  weights: tuple[float, float, float] = (0.5, 0.3, 0.2)  # reasoning, sourcing, validity
  evaluator_temperature: float = 0.1
  arbiter_temperature: float = 0.0
  evaluator_max_tokens: int = 1000  # the authors' call_llm
  arbiter_max_tokens: int = 1000
  reward: str = "arbiter"  # or "weighted"
  arbiter_parse: str = "lenient"  # or "authors"
  out_of_range: str = "reject"  # or "clip"
  failed_evaluator_score: float = 1.0  # the lowest score
  failed_feedback: str = "Error"
  failed_arbiter_score: float = 0.0  # the authors: anything but "A" is incorrect

  def __post_init__(self):
    w = tuple(float(x) for x in self.weights)
    if len(w) != 3 or min(w) < 0 or abs(sum(w) - 1.0) > 1e-6:
      raise ValueError(f"NoGtConfig.weights must be 3 non-negative numbers summing to 1, "
                       f"got {self.weights!r}")
    object.__setattr__(self, "weights", w)
    for name in ("evaluator_temperature", "arbiter_temperature"):
      if getattr(self, name) < 0:
        raise ValueError(f"NoGtConfig.{name} must be >= 0, got {getattr(self, name)!r}")
    for name in ("evaluator_max_tokens", "arbiter_max_tokens"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"NoGtConfig.{name} must be a positive integer, "
                         f"got {getattr(self, name)!r}")
    for name, allowed in (("reward", ("arbiter", "weighted")),
                          ("arbiter_parse", ("lenient", "authors")),
                          ("out_of_range", ("reject", "clip"))):
      if getattr(self, name) not in allowed:
        raise ValueError(f"NoGtConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
    if not 1.0 <= self.failed_evaluator_score <= 10.0:
      raise ValueError(f"NoGtConfig.failed_evaluator_score must be in [1, 10], "
                       f"got {self.failed_evaluator_score!r}")
    if not 0.0 <= self.failed_arbiter_score <= 1.0:
      raise ValueError(f"NoGtConfig.failed_arbiter_score must be in [0, 1], "
                       f"got {self.failed_arbiter_score!r}")


@dataclasses.dataclass(frozen=True)
class Candidate:
  final_output: str
  trajectory: str = ""  # `format_trajectory` of the executor's turns


@dataclasses.dataclass(frozen=True)
class EvaluatorResult:
  score: float  # in [1, 10]
  reason: str
  feedback: str  # what the arbiter saw (the reply, or failed_feedback)
  failure: str | None = None


@dataclasses.dataclass(frozen=True)
class NoGtJudgement:
  evaluators: dict[str, EvaluatorResult]
  verdict: str | None  # "correct" / "incorrect"; None when the arbiter failed
  arbiter: float  # 1.0 correct, 0.0 incorrect, failed_arbiter_score on failure
  weighted: float  # (sum_k w_k s_k - 1) / 9
  reward: float  # arbiter or weighted, per NoGtConfig.reward
  arbiter_failure: str | None = None
  raw_verdict: str | None = None


def weighted_score(scores: Sequence[float], weights: Sequence[float]) -> float:
  """(sum_k w_k s_k - 1) / 9: scores 1..10 mapped onto [0, 1]."""
  return (sum(w * s for w, s in zip(weights, scores)) - 1.0) / 9.0


def authors_verdict(reply: str) -> str:
  """judge_nogt.py: drop dots and spaces, upper-case; "A" anywhere means correct."""
  return "correct" if "A" in reply.replace(".", "").replace(" ", "").strip().upper() \
      else "incorrect"


def _words(text: str, max_words: int) -> str:
  words = text.split()
  if len(words) <= max_words:
    return " ".join(words) if text.strip() else text
  return " ".join(words[:max_words] + ["... (Omitted part of the results returned by the tool)"])


def format_trajectory(question: str, messages: Sequence[dict], max_words: int = 1024) -> str:
  """The executor's turns as the evaluators read them (the authors' `get_format_workflow`,
  mmsearch_skill.py): assistant turns as rounds, tool results cut to `max_words` words."""
  trace, rounds = f"### Question: {question}\n", 1
  for message in messages:
    content = message.get("content", "")
    if isinstance(content, list):
      content = " ".join(str(item.get("text", "")).strip() for item in content
                         if isinstance(item, dict) and item.get("type") == "text")
    content = str(content)
    if message.get("role") == "assistant":
      trace += f"### Round {rounds}:\n#### Agent Reasoning and Tool Call:\n{content}\n"
      rounds += 1
    else:
      trace += f"#### Tool Call Return Results:\n{_words(content, max_words)}\n"
  return trace


class NoGtJudge:
  """Scores candidate answers without gold answers; counts failures per role and kind."""

  def __init__(self, backend: ChatBackend, config: NoGtConfig = NoGtConfig()):
    self.backend, self.config = backend, config
    self.evaluator_failures = replies.FailureCounts(EVALUATOR_FAILURES)
    self.arbiter_failures = replies.FailureCounts(ARBITER_FAILURES)

  def evaluator_messages(self, name: str, question: str, c: Candidate) -> list[dict]:
    text = prompts.EVALUATORS[name].format(question=question, trajectory=c.trajectory or "(none)",
                                           final_output=c.final_output)
    return [{"role": "user", "content": text}]

  def arbiter_messages(self, question: str, c: Candidate,
                       evaluators: dict[str, EvaluatorResult]) -> list[dict]:
    w = dict(zip(EVALUATORS, self.config.weights))
    text = prompts.ARBITER.format(
        question=question, trajectory=c.trajectory or "(none)", final_output=c.final_output,
        **{f"w_{k}": f"{w[k]:g}" for k in EVALUATORS},
        **{k: evaluators[k].feedback for k in EVALUATORS})
    return [{"role": "user", "content": text}]

  def judge(self, question: str, candidate: Candidate) -> NoGtJudgement:
    return self.judge_many([(question, candidate)])[0]

  def judge_group(self, question: str, candidates: Sequence[Candidate]) -> list[NoGtJudgement]:
    """The G answers of one question: 3G evaluator calls in one batch, then G arbiter calls."""
    return self.judge_many([(question, c) for c in candidates])

  def judge_many(self, items: Sequence[tuple[str, Candidate]]) -> list[NoGtJudgement]:
    cfg = self.config
    convs = [self.evaluator_messages(name, q, c) for q, c in items for name in EVALUATORS]
    answers = replies.ask_all(self.backend, convs, max_tokens=cfg.evaluator_max_tokens,
                              temperature=cfg.evaluator_temperature,
                              failures=self.evaluator_failures)
    evals = [{name: self.parse_evaluator(answers[3 * i + k]) for k, name in enumerate(EVALUATORS)}
             for i in range(len(items))]
    verdicts = replies.ask_all(self.backend,
                               [self.arbiter_messages(q, c, e) for (q, c), e in zip(items, evals)],
                               max_tokens=cfg.arbiter_max_tokens,
                               temperature=cfg.arbiter_temperature,
                               failures=self.arbiter_failures)
    return [self._combine(e, v) for e, v in zip(evals, verdicts)]

  def parse_evaluator(self, reply: str | JudgeError) -> EvaluatorResult:
    """An evaluator reply -> score in [1, 10] and reason; failures counted (backend ones by
    `ask_all`) and scored failed_evaluator_score."""
    cfg, failed = self.config, self.config.failed_evaluator_score
    if isinstance(reply, JudgeError):
      return EvaluatorResult(failed, str(reply), cfg.failed_feedback,
                             replies.backend_failure_kind(reply))
    body = replies.strip_think(reply)
    if not body:
      self.evaluator_failures.add("empty_reply", repr(reply[:80]))
      return EvaluatorResult(failed, "empty reply", cfg.failed_feedback, "empty_reply")
    score, _ = replies.find_number(body, "score")
    reason = replies.find_reason(body)
    if score is None:
      self.evaluator_failures.add("no_score", body[:120])
      return EvaluatorResult(failed, reason, body, "no_score")
    if not 1.0 <= score <= 10.0:
      if cfg.out_of_range == "reject":
        self.evaluator_failures.add("score_out_of_range", f"score {score:g}: {body[:80]}")
        return EvaluatorResult(failed, reason, body, "score_out_of_range")
      self.evaluator_failures.add("score_clipped", f"score {score:g}")
      score = min(max(score, 1.0), 10.0)
    return EvaluatorResult(score, reason, body)

  def parse_verdict(self, reply: str | JudgeError) -> tuple[str | None, str | None]:
    """(verdict, failure kind) of an arbiter reply; backend failures already counted."""
    if isinstance(reply, JudgeError):
      return None, replies.backend_failure_kind(reply)
    if self.config.arbiter_parse == "authors":
      return authors_verdict(reply), None
    body = replies.strip_think(reply)
    if not body:
      self.arbiter_failures.add("empty_reply", repr(reply[:80]))
      return None, "empty_reply"
    verdict, _ = replies.find_verdict(body, _CHOICES)
    if verdict is None:
      self.arbiter_failures.add("unparseable_verdict", body[:120])
      return None, "unparseable_verdict"
    return verdict, None

  def _combine(self, evals: dict[str, EvaluatorResult], reply) -> NoGtJudgement:
    cfg = self.config
    verdict, failure = self.parse_verdict(reply)
    arbiter = cfg.failed_arbiter_score if verdict is None else float(verdict == "correct")
    weighted = weighted_score([evals[k].score for k in EVALUATORS], cfg.weights)
    return NoGtJudgement(evals, verdict, arbiter, weighted,
                         arbiter if cfg.reward == "arbiter" else weighted, failure,
                         reply if isinstance(reply, str) else None)
