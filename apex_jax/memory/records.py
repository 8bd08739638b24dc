"""The records the memory bank hands out and takes in (frozen dataclasses)."""

from __future__ import annotations

import dataclasses
from typing import Any

from apex_jax.memory.schema import Bucket


def initial_success(correct: bool) -> int:
  """A new memory's success count: its own episode is its first use (usage 1), a win when the
  episode was correct; so a memory starts with win rate 1 if correct, 0 if not."""
  return int(bool(correct))


@dataclasses.dataclass(frozen=True)
class Memory:
  """One experience. Win rate w = success_count / usage_count, starting at 1 / 1 for a correct
  episode's memory and 0 / 1 for a failed one's (`initial_success`)."""
  id: int
  category: str
  modality: str
  question: str
  workflow_summary: str
  outcome: str
  success_count: int = 1
  usage_count: int = 1
  caption: str | None = None
  data_id: str | None = None

  @property
  def bucket(self) -> Bucket:
    return Bucket(self.category, self.modality)

  @property
  def correct(self) -> bool:
    return self.outcome == "correct"

  @property
  def win_rate(self) -> float:
    return self.success_count / self.usage_count


@dataclasses.dataclass(frozen=True)
class ProcedureStep:
  step: int
  action: str
  purpose: str


@dataclasses.dataclass(frozen=True)
class Skill:
  """A bucket's skill document (the authors' Writer schema) plus the bank's own evidence counts.

  win_rate = correct_count / evidence_count (0 with no evidence). The counts are kept by the bank
  from stored memories, never copied from the Distiller's reply.
  """
  category: str
  modality: str
  name: str
  description: str
  procedure: tuple[ProcedureStep, ...]
  pitfalls: tuple[str, ...]
  version: int
  correct_count: int
  evidence_count: int
  operation: str
  absorbed_ids: tuple[int, ...] = ()

  @property
  def bucket(self) -> Bucket:
    return Bucket(self.category, self.modality)

  @property
  def win_rate(self) -> float:
    return self.correct_count / self.evidence_count if self.evidence_count else 0.0

  def to_dict(self) -> dict[str, Any]:
    return {"skill_name": self.name, "category": self.category, "modality": self.modality,
            "description": self.description,
            "procedure": [dataclasses.asdict(s) for s in self.procedure],
            "pitfalls": list(self.pitfalls), "win_rate": self.win_rate, "version": self.version,
            "evidence_count": self.evidence_count, "correct_count": self.correct_count,
            "operation": self.operation, "absorbed_ids": list(self.absorbed_ids)}


@dataclasses.dataclass(frozen=True)
class NewMemory:
  """A memory to add. category None: routed by the bank's classifier; modality None: from the
  caption (a blank caption counts as none)."""
  question: str
  workflow_summary: str
  outcome: bool | str
  category: str | None = None
  modality: str | None = None
  caption: str | None = None
  data_id: str | None = None


@dataclasses.dataclass(frozen=True)
class AddResult:
  """action: 'added', 'replaced' (other_id was deleted), 'dropped' (other_id kept, nothing
  stored, id None) or 'added_duplicate' (other_id kept too); similarity: to other_id."""
  action: str
  id: int | None
  other_id: int | None = None
  similarity: float | None = None


@dataclasses.dataclass(frozen=True)
class ScoredMemory:
  memory: Memory
  score: float      # f = alpha sim~ + (1 - alpha) w
  sim: float
  sim_norm: float


@dataclasses.dataclass(frozen=True)
class Retrieval:
  bucket: Bucket
  correct: tuple[ScoredMemory, ...]
  incorrect: tuple[ScoredMemory, ...]

  @property
  def memory_ids(self) -> tuple[int, ...]:
    return tuple(s.memory.id for s in self.correct + self.incorrect)


@dataclasses.dataclass(frozen=True)
class PlannerContext:
  """E(q): the text for the Planner, the memory ids it shows, and the skill if gamma > min."""
  text: str
  bucket: Bucket
  memory_ids: tuple[int, ...]
  skill: Skill | None
  gamma: float


@dataclasses.dataclass(frozen=True)
class OutcomeResult:
  updated: tuple[int, ...]
  missing: tuple[int, ...]  # ids no longer stored (replaced since they were retrieved)
