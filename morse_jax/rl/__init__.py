"""RL core: group advantages (GRPO, HGRPO), losses, the update batch (module `batch`) and its
log-probs (`logprobs`), B x M rollouts, the update object (module `update`) and its jitted step
(module `train_step`), the training loop, its state (checkpointed by `morse_jax.checkpoint`),
a run's life around them (module `run`), metrics, multi-process start-up.

The names below are loaded on first use, so that importing one submodule (e.g. `rl.rollout`)
does not import the others (`rl.train_step`; tests/test_layers.py checks it).
"""

import importlib

_EXPORTS = {
    "advantages": ("HgrpoAdvantages", "RowAdvantages", "grpo", "hgrpo", "row_advantages"),
    "losses": ("aggregate", "k3_kl", "policy_loss", "router_loss"),
    "batch": ("PolicyBatch", "RouterBatch", "Segment", "pack", "update_batch"),
    "loop": ("SinceLastSave", "run_loop"),
    "rollout": ("GroupRollout", "NodeRequest"),
    "run": ("Run", "record"),
    "state": ("TrainState",),
    "train_step": ("StepConfig",),
    "update": ("Update",),
    "trainer": ("RolloutConfig", "TrainNode", "Trainer", "fit"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
