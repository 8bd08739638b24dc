"""The whole RL training state: what a checkpoint holds (`morse_jax.checkpoint`) so that a
stopped run resumes exactly."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything that changes during training.

  `rng` is a typed key (`jax.random.key`); checkpoints store its raw data and its impl name.
  `cursor` counts the training items the data source has handed out, so a resumed run skips
  exactly those.
  """

  step: jax.Array  # int32 scalar: updates applied so far
  experts: Any  # e.g. dict[str, ExpertWeights]
  router: Any  # router params, or None
  opt_states: Any  # tuple of optax states; entries may be None
  rng: jax.Array  # typed PRNG key
  cursor: jax.Array  # int32 scalar
