"""The rng key of each executor turn when episodes advance on their own (issue 55), equal to the
key the lockstep loop gives it.

The lockstep loop's round k is one sampler call over the runs still active, in run order, with
rng fold_in(rng, k); its row m draws with fold_in(fold_in(rng, k), m). A run's round is the
number of turns it took in this loop, so its key at round k needs m: the number of runs before it
that are active at round k. That is known once each of them has ended or taken k turns; until
then a sampled run's turn waits (on runs before it only). A greedy turn draws nothing, so it
never waits.
"""

from __future__ import annotations

import jax


class TurnKeys:
  def __init__(self, rng: jax.Array, runs: int, greedy: bool):
    self.rng, self.greedy = rng, greedy
    self.turns = [0] * runs  # turns taken (and their tool calls done) in this loop
    self.ended = [False] * runs

  def record(self, run: int, ended: bool) -> None:
    """Run `run` took a turn (its tool call done); ended: it will take no other."""
    self.turns[run] += 1
    self.ended[run] = ended

  def end(self, run: int) -> None:
    """Run `run` ended before taking a turn (its budget spent)."""
    self.ended[run] = True

  def key(self, run: int) -> jax.Array | None:
    """The key of the run's next turn; None while a run before it may still turn out active or
    not at that round."""
    k = self.turns[run]
    row = run  # a greedy turn draws nothing: any key does
    if not self.greedy:
      row = 0
      for j in range(run):
        if self.turns[j] < k and not self.ended[j]:
          return None
        row += self.turns[j] > k or (self.turns[j] == k and not self.ended[j])
    return jax.random.fold_in(jax.random.fold_in(self.rng, k), row)
