"""What the bank does with a batch of judged episodes (the authors' memory server after a
judgement): the win rates of the memories each episode was shown move with its outcome, every
episode is stored as a memory with that outcome, and the buckets due for evolution get a
Distiller reply. Memory building and TTRL both consolidate through `consolidate`; memory
building evolves once, after all its batches, and counts that through `count_evolutions`."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, MutableMapping, Sequence

from apex_jax.memory.evolution import DistillerResult
from apex_jax.memory.records import AddResult, NewMemory


@dataclasses.dataclass(frozen=True)
class Judged:
  """One judged episode: the memory it leaves, its outcome, and the memories it was shown (to
  its plan and its replan), whose win rates that outcome updates."""
  memory: NewMemory
  correct: bool
  shown: tuple[int, ...] = ()
  store: bool = True  # False: its outcome still moves the shown win rates, nothing is stored


def consolidate(bank, judged: Sequence[Judged], stats: MutableMapping[str, float], *,
                evolve: Callable[[], Iterable[DistillerResult]] | None = None) -> list[AddResult]:
  """The shown memories' outcomes recorded (one call per episode, in order), then every
  episode's memory stored (one add_many), then, with `evolve`, the Distiller's results counted
  (evolve applies its replies itself). Adds memories_stored and the evolution counts to stats."""
  for j in judged:
    if j.shown:
      bank.record_outcome(j.shown, j.correct)
  added = bank.add_many([j.memory for j in judged if j.store])
  stats["memories_stored"] += sum(r.id is not None for r in added)
  if evolve is not None:
    count_evolutions(stats, evolve())
  return added


def count_evolutions(stats: MutableMapping[str, float],
                     results: Iterable[DistillerResult]) -> None:
  """evolutions_applied / evolutions_failed per result; unknown_absorbed_ids (dropped from an
  applied reply) and bucket_overwrites (category / modality set to the bucket's) summed, each
  key touched only when non-zero (a Counter's metrics keep only what happened)."""
  for result in results:
    stats["evolutions_applied" if result.applied else "evolutions_failed"] += 1
    if result.unknown_absorbed_ids:  # memory/skills.py
      stats["unknown_absorbed_ids"] += result.unknown_absorbed_ids
    if result.bucket_overwrites:  # memory/skills.py
      stats["bucket_overwrites"] += result.bucket_overwrites
