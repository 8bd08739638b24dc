"""Orbax checkpoints of the trainable part only: experts and router (the backbone stays frozen)."""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class AdapterCheckpointError(ValueError):
  """A checkpoint is missing, unreadable or does not match the expected shapes."""


def _manager(directory: str, max_to_keep: int | None = None) -> ocp.CheckpointManager:
  directory = os.path.abspath(directory)  # orbax requires absolute paths
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
  return ocp.CheckpointManager(directory, options=options)


def save(directory: str, step: int, experts, router_params, metadata: dict | None = None,
         max_to_keep: int | None = None) -> None:
  """Writes step `step` (orbax writes to a temporary name and renames when complete)."""
  manager = _manager(directory, max_to_keep)
  manager.save(step, args=ocp.args.Composite(
      experts=ocp.args.StandardSave(experts), router=ocp.args.StandardSave(router_params),
      metadata=ocp.args.JsonSave(metadata or {})))
  manager.wait_until_finished()
  manager.close()


def restore(directory: str, experts_like, router_like, step: int | None = None):
  """Restores (experts, router_params, metadata) shaped like the given templates.

  step None takes the latest. Shape or structure mismatches (orbax checks them against the
  templates) raise AdapterCheckpointError naming the directory, the step and orbax's reason.
  """
  manager = _manager(directory)
  try:
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
      raise AdapterCheckpointError(f"{directory}: no checkpoint at step {step} "
                                   f"(have {sorted(manager.all_steps())})")
    abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    try:
      out = manager.restore(step, args=ocp.args.Composite(
          experts=ocp.args.StandardRestore(abstract(experts_like)),
          router=ocp.args.StandardRestore(abstract(router_like)),
          metadata=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises several types for corrupt or mismatched trees
      raise AdapterCheckpointError(f"{directory}: step {step} does not match the expected "
                                   f"experts/router: {e}") from e
    return out["experts"], out["router"], out["metadata"]
  finally:
    manager.close()
