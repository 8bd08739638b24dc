"""Orbax checkpoints of the trainable part only: experts and router (the backbone stays frozen).

Each step also holds a `checksums` item (sha256 of every array's bytes, as
`morse_jax.rl.state.array_checksums` computes them) written inside orbax's atomic commit;
`restore` refuses an array whose bytes differ (AdapterCheckpointError naming the step and the
array). Saves use temporary names unique per save (`morse_jax.rl.state`'s, so two writers of one
step do not delete each other's files). A step written before checksums existed restores
unverified, with a warning.
"""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp

from morse_jax.rl import state as state_lib

log = logging.getLogger(__name__)


class AdapterCheckpointError(ValueError):
  """A checkpoint is missing, unreadable, corrupt or does not match the expected shapes."""


def _manager(directory: str, max_to_keep: int | None = None) -> ocp.CheckpointManager:
  directory = os.path.abspath(directory)  # orbax requires absolute paths
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True,
      temporary_path_class=state_lib.unique_temporary_path_class(state_lib.run_token()))
  return ocp.CheckpointManager(directory, options=options)


def save(directory: str, step: int, experts, router_params, metadata: dict | None = None,
         max_to_keep: int | None = None) -> None:
  """Writes step `step` (orbax writes to a temporary name and renames when complete)."""
  manager = _manager(directory, max_to_keep)
  checksums = {"format": "sha256/1",
               "arrays": state_lib.array_checksums({"experts": experts,
                                                     "router": router_params})}
  manager.save(step, args=ocp.args.Composite(
      experts=ocp.args.StandardSave(experts), router=ocp.args.StandardSave(router_params),
      metadata=ocp.args.JsonSave(metadata or {}), checksums=ocp.args.JsonSave(checksums)))
  manager.wait_until_finished()
  manager.close()


def restore(directory: str, experts_like, router_like, step: int | None = None):
  """Restores (experts, router_params, metadata) shaped like the given templates.

  step None takes the latest. Shape or structure mismatches (orbax checks them against the
  templates) raise AdapterCheckpointError naming the directory, the step and orbax's reason;
  so does an array whose bytes differ from the checksum saved with it.
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
    _verify(manager, directory, step, {"experts": out["experts"], "router": out["router"]})
    return out["experts"], out["router"], out["metadata"]
  finally:
    manager.close()


def _verify(manager: ocp.CheckpointManager, directory: str, step: int, arrays) -> None:
  if not os.path.isdir(os.path.join(os.path.abspath(directory), str(step), "checksums")):
    log.warning("%s step %d has no checksums (written before they existed): restored "
                "unverified", directory, step)
    return
  try:
    saved = manager.restore(step, args=ocp.args.Composite(
        checksums=ocp.args.JsonRestore()))["checksums"]["arrays"]
  except Exception as e:
    raise AdapterCheckpointError(f"{directory}: step {step}: checksums are unreadable or "
                                 f"corrupt: {e}") from e
  now = state_lib.array_checksums(arrays)
  for name in sorted(set(now) | set(saved)):
    want, got = saved.get(name), now.get(name)
    if want is None or got is None:
      raise AdapterCheckpointError(f"{directory}: step {step}: array {name} has no checksum or "
                                   f"no data")
    if want.get("sha256") and got["sha256"] and want != got:
      raise AdapterCheckpointError(f"{directory}: step {step}: array {name} does not match its "
                                   f"checksum: the files are damaged")
