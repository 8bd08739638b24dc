"""The Distiller's quality term: an LLM grades a skill document A / B / C (1.0 / 0.5 / 0.0);
with `SkillJudgeConfig.term` "format" or "evolution", the same judge grades that term instead
(the paper's J_skill judges each term; the authors score those two by rules).

The paper's distiller reward is 0.5 quality + 0.1 format + 0.4 evolution rationality, quality
judged by an LLM (the authors' `_score_llm_quality`, J-Ding519/APEx Writer-Train/Train/
writer_skill/writer_dataset.py: the judge sees the memories, the current skill and the generated
one, answers one letter at temperature 0.1, and a failed call falls back to the rule-based
score). Here the prompt is ours (`prompts.SKILL_QUALITY`); replies are read leniently
(`replies.find_verdict`: "A", "**B**", "Grade: C", a JSON grade); a reply we cannot read, an
empty one or a failed call is a counted failure whose grade is None, and the reward then uses
the rule-based quality (`rewards.skill_quality_rules`), as the authors do for a failed call.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from apex_jax.judges import prompts, replies
from apex_jax.judges.chat import ChatBackend, JudgeError

FAILURES = replies.BACKEND_FAILURES + ("empty_reply", "unparseable")
GRADES = {"A": 1.0, "B": 0.5, "C": 0.0}


# the term of the distiller reward a judge grades -> its prompt (the paper's J_skill grades each)
TERMS = {"quality": "SKILL_QUALITY", "format": "SKILL_FORMAT", "evolution": "SKILL_EVOLUTION"}


@dataclasses.dataclass(frozen=True)
class SkillJudgeConfig:
  max_tokens: int = 16  # one letter; room for a short preamble
  temperature: float = 0.1  # the authors'
  term: str = "quality"  # which reward term it grades (TERMS)

  def __post_init__(self):
    if self.term not in TERMS:
      raise ValueError(f"SkillJudgeConfig.term {self.term!r} not in {tuple(TERMS)}")
    if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
      raise ValueError(f"SkillJudgeConfig.max_tokens must be a positive integer, "
                       f"got {self.max_tokens!r}")
    if not self.temperature >= 0:
      raise ValueError(f"SkillJudgeConfig.temperature must be >= 0, got {self.temperature!r}")


@dataclasses.dataclass(frozen=True)
class SkillItem:
  generated_skill: str  # the Distiller's reply as JSON text (parsed and re-dumped)
  memories: str  # the evolution batch as the Distiller saw it (memory.format_batch)
  current_skill: str = "null"  # the skill it replaces as JSON, "null" when none


class SkillJudge:
  """Skill quality over any ChatBackend; `failures.snapshot()` counts failures by kind."""

  def __init__(self, backend: ChatBackend, config: SkillJudgeConfig = SkillJudgeConfig()):
    self.backend, self.config = backend, config
    self.failures = replies.FailureCounts(FAILURES)

  def messages(self, item: SkillItem) -> list[dict]:
    text = getattr(prompts, TERMS[self.config.term]).format(
        memories=item.memories, current_skill=item.current_skill,
        generated_skill=item.generated_skill)
    return [{"role": "user", "content": text}]

  def grade_many(self, items: Sequence[SkillItem]) -> list[float | None]:
    """Grades in [0, 1] (None: no grade, the caller's fallback), one batched backend call."""
    got = replies.ask_all(self.backend, [self.messages(it) for it in items],
                          max_tokens=self.config.max_tokens,
                          temperature=self.config.temperature, failures=self.failures)
    return [self.parse(reply) for reply in got]

  def parse(self, reply: str | JudgeError) -> float | None:
    if isinstance(reply, JudgeError):  # counted by ask_all
      return None
    body = replies.strip_think(reply)
    if not body:
      self.failures.add("empty_reply", repr(reply[:80]))
      return None
    letter, _ = replies.find_verdict(body, {k: k for k in GRADES})
    if letter is None:
      self.failures.add("unparseable", body[:120])
      return None
    return GRADES[letter]
