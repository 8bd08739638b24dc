"""A contextual bandit over tokens: the smallest task on which routing and HGRPO can be seen.

Each node belongs to one of C categories. Its prompt starts with the category's marker token and
continues with random tokens; its router embedding is the category's fixed direction plus noise.
A completion earns the fraction of its tokens that fall in the category's target range of the
vocabulary. Items are a pure function of (seed, index), so a resumed run sees the same nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from morse_jax.rl.trainer import TrainNode


@dataclasses.dataclass(frozen=True)
class TokenBandit:
  vocab_size: int
  categories: int = 4
  embed_dim: int = 16
  prompt_len: int = 6
  noise: float = 0.1
  seed: int = 0

  def __post_init__(self):
    if self.categories < 1 or self.vocab_size < 2 * self.categories + 1:
      raise ValueError(f"TokenBandit: vocab_size={self.vocab_size} is too small for "
                       f"categories={self.categories} (needs > 2 * categories)")

  def _directions(self) -> np.ndarray:
    return np.random.default_rng([self.seed, 1 << 20]).normal(size=(self.categories,
                                                                    self.embed_dim))

  def target(self, category: int) -> range:
    """The upper half of the vocabulary split into C equal ranges, one per category."""
    start = self.vocab_size // 2
    width = (self.vocab_size - start) // self.categories
    return range(start + category * width, start + (category + 1) * width)

  def category(self, index: int) -> int:
    return int(np.random.default_rng([self.seed, index]).integers(self.categories))

  def node(self, index: int) -> TrainNode:
    rng = np.random.default_rng([self.seed, index])
    c = int(rng.integers(self.categories))
    prompt = [1 + c] + rng.integers(1 + self.categories, self.vocab_size // 2,
                                    self.prompt_len - 1).tolist()
    emb = self._directions()[c] + self.noise * rng.normal(size=self.embed_dim)
    return TrainNode(prompt=prompt, role="execute", embedding=emb.astype(np.float32))

  def batch(self, cursor: int, count: int):
    """(nodes cursor .. cursor + count - 1, a reward function over a rollout of them)."""
    indices = list(range(cursor, cursor + count))
    categories = [self.category(i) for i in indices]

    def rewards(rollout) -> np.ndarray:
      return np.asarray([self.reward(categories[rollout.node_of_row(r)], c)
                         for r, c in enumerate(rollout.completions)], np.float32)

    return [self.node(i) for i in indices], rewards

  def reward(self, category: int, completion: Sequence[int]) -> float:
    if len(completion) == 0:
      return 0.0
    t = self.target(category)
    return float(np.mean([t.start <= int(x) < t.stop for x in completion]))
