"""consolidate: shown memories' outcomes, then the new memories, then the evolution, counted."""

import collections

from apex_jax.memory import DistillerResult, MemoryBank, NewMemory
from apex_jax.memory.consolidation import Judged, consolidate, count_evolutions
from tests.apex.memory.fakes import HashEmbedder


def test_outcomes_then_memories_then_evolution(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder())
  old = bank.add("who wrote the book", "1. search", True, category="human").id
  order = []
  evolved = [DistillerResult(True, "synthesize", None, unknown_absorbed_ids=2),
             DistillerResult(False, None, None)]

  def evolve():
    order.append(("evolve", len(bank), bank.get(old).usage_count))
    return evolved

  stats = collections.Counter()
  judged = [Judged(NewMemory("where is the river", "1. look", False, category="location"),
                   False, (old,)),
            Judged(NewMemory("when was it built", "1. date", True, category="time"), True)]
  added = consolidate(bank, judged, stats, evolve=evolve)
  assert [r.action for r in added] == ["added", "added"]
  assert order == [("evolve", 3, 2)]  # the outcome and both memories were in before evolve ran
  assert bank.get(old).success_count == 1  # both counts start at 1; this use failed
  assert stats == {"memories_stored": 2, "evolutions_applied": 1, "evolutions_failed": 1,
                   "unknown_absorbed_ids": 2}  # zero counts leave no key
  count_evolutions(stats, [DistillerResult(True, "refine", None, bucket_overwrites=1)])
  assert stats["evolutions_applied"] == 2 and stats["bucket_overwrites"] == 1
  bank.close()
