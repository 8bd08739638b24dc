"""RL core: group advantages (GRPO, HGRPO), losses, B x M rollouts, the jitted update (module
`train_step`), the training loop, its state and checkpoints, metrics, multi-process start-up."""

from morse_jax.rl.advantages import (HgrpoAdvantages, RowAdvantages, grpo, hgrpo, row_advantages,
                                     should_skip)
from morse_jax.rl.losses import aggregate, k3_kl, policy_loss, router_loss
from morse_jax.rl.rollout import GroupRollout, NodeRequest, Segment, pack
from morse_jax.rl.state import CheckpointError, Checkpoints, TrainState
from morse_jax.rl.train_step import PolicyBatch, RouterBatch, StepConfig
from morse_jax.rl.trainer import RolloutConfig, TrainNode, Trainer, fit
