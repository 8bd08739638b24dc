"""R_align: how well a plan follows its bucket's skill document, scored by an LLM in [0, 1].

As the authors define it (`compute_skill_alignment`, J-Ding519/APEx
TTRL/TTRL-nogt/local_search/mmsearch_skill.py): the judge reads the skill's procedure steps
("n. action — purpose") and pitfalls ("- pitfall") and the plan, and replies with one number in
[0, 1] (`prompts.SKILL_ALIGNMENT`, temperature 0, at most 16 tokens). The number is clipped to
[0, 1]; any failure scores 0. A skill with neither procedure nor pitfalls scores 0 without a call,
and the authors mix R_align into the reward only for skills that have one (`has_guidance`):
  R = (1 - l_s) * R_nogt + l_s * R_align   (built by the training code, not here).

The authors read the reply by deleting every character but digits and dots; we take a JSON
`score`, a "Score: x" label, a bare number, or the only number in the reply, and count the rest
as failures by kind.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from apex_jax.judges import prompts, replies
from apex_jax.judges.chat import ChatBackend, JudgeError
from apex_jax.memory.records import Skill

FAILURES = replies.BACKEND_FAILURES + ("empty_reply", "no_score", "score_clipped")
SkillLike = Skill | Mapping[str, Any]  # a stored Skill, or the authors' dict (procedure, pitfalls)


@dataclasses.dataclass(frozen=True)
class AlignConfig:
  max_tokens: int = 16
  temperature: float = 0.0
  failure_score: float = 0.0

  def __post_init__(self):
    if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
      raise ValueError(f"AlignConfig.max_tokens must be a positive integer, "
                       f"got {self.max_tokens!r}")
    if self.temperature < 0:
      raise ValueError(f"AlignConfig.temperature must be >= 0, got {self.temperature!r}")
    if not 0.0 <= self.failure_score <= 1.0:
      raise ValueError(f"AlignConfig.failure_score must be in [0, 1], got {self.failure_score!r}")


@dataclasses.dataclass(frozen=True)
class Alignment:
  score: float  # in [0, 1]
  failure: str | None = None
  raw: str | None = None


def _parts(skill: SkillLike) -> tuple[Any, Any]:
  if isinstance(skill, Skill):
    return skill.procedure, skill.pitfalls
  return skill.get("procedure") or [], skill.get("pitfalls") or []


def has_guidance(skill: SkillLike | None) -> bool:
  """Whether the skill has procedure steps or pitfalls (else R_align is not used)."""
  return skill is not None and any(bool(p) for p in _parts(skill))


def format_procedure(procedure) -> str:
  if not procedure:
    return "(no procedure available)"
  if isinstance(procedure, str):
    return procedure
  lines = []
  for step in procedure:
    if isinstance(step, Mapping):
      n, action, purpose = step.get("step", ""), step.get("action", ""), step.get("purpose", "")
    elif hasattr(step, "action"):
      n, action, purpose = step.step, step.action, step.purpose
    else:
      lines.append(str(step))
      continue
    lines.append(f"{n}. {action} — {purpose}" if purpose else f"{n}. {action}")
  return "\n".join(lines)


def format_pitfalls(pitfalls) -> str:
  if not pitfalls:
    return "(no pitfalls recorded)"
  if isinstance(pitfalls, str):
    return pitfalls
  return "\n".join(f"- {p}" for p in pitfalls)


_WORD = re.compile(r"[\w.]+")
_DECIMAL = re.compile(r"\d+(?:\.\d+)?")


def _standalone_numbers(text: str) -> list[str]:
  """`re.findall(r"(?<![\\w.])\\d+(?:\\.\\d+)?(?![\\w.]*\\d)", text)` in linear time: per word
  of [\\w.] characters, its start up to its last digit when that is a decimal number (`7`,
  `0.8` in `0.8.`, `3` in `3rd`; nothing in `v2`, `1.2.3` or `2x4`). The lookahead ran to the
  word's end again for every shorter number tried: quadratic on a long run of digits."""
  out = []
  for word in _WORD.findall(text):
    last = len(word) - 1
    while last >= 0 and not word[last].isdecimal():
      last -= 1
    if last >= 0 and _DECIMAL.fullmatch(word, 0, last + 1):
      out.append(word[:last + 1])
  return out


class AlignJudge:
  """R_align over any ChatBackend; `failures.snapshot()` counts failures by kind."""

  def __init__(self, backend: ChatBackend, config: AlignConfig = AlignConfig()):
    self.backend, self.config = backend, config
    self.failures = replies.FailureCounts(FAILURES)

  def messages(self, plan: str, skill: SkillLike) -> list[dict]:
    procedure, pitfalls = _parts(skill)
    text = prompts.SKILL_ALIGNMENT.format(procedure=format_procedure(procedure),
                                          pitfalls=format_pitfalls(pitfalls), plan=plan)
    return [{"role": "user", "content": text}]

  def score(self, plan: str, skill: SkillLike | None) -> Alignment:
    return self.score_many([(plan, skill)])[0]

  def score_many(self, items: Sequence[tuple[str, SkillLike | None]]) -> list[Alignment]:
    """Scores of (plan, skill) pairs, the ones with guidance asked in one batched call."""
    ask = [i for i, (_, skill) in enumerate(items) if has_guidance(skill)]
    got = replies.ask_all(self.backend, [self.messages(*items[i]) for i in ask],
                          max_tokens=self.config.max_tokens,
                          temperature=self.config.temperature, failures=self.failures)
    out = [Alignment(0.0) for _ in items]  # no guidance: 0, no call (the authors)
    for i, reply in zip(ask, got):
      out[i] = self.parse(reply)
    return out

  def parse(self, reply: str | JudgeError) -> Alignment:
    """A reply -> score clipped to [0, 1]; failures counted and scored failure_score."""
    if isinstance(reply, JudgeError):  # counted by ask_all
      return Alignment(self.config.failure_score, replies.backend_failure_kind(reply))
    body = replies.strip_think(reply)
    if not body:
      self.failures.add("empty_reply", repr(reply[:80]))
      return Alignment(self.config.failure_score, "empty_reply", reply)
    score, how = replies.find_number(body, "score")
    if how == "ratio":  # "7/10"
      score /= 10.0
    if score is None:
      numbers = _standalone_numbers(body)
      score = replies.finite_number(numbers[0]) if len(numbers) == 1 else None  # None for 1e400
    if score is None:
      self.failures.add("no_score", body[:120])
      return Alignment(self.config.failure_score, "no_score", reply)
    if not 0.0 <= score <= 1.0:
      self.failures.add("score_clipped", f"score {score:g}")
      score = min(max(score, 0.0), 1.0)
    return Alignment(score, None, reply)
