"""The whole RL training state and its orbax checkpoints, so a stopped run resumes exactly.

Resuming exactly needs more than the weights: the optimiser moments, the PRNG key and the data
cursor too, or the resumed run samples different prompts and noise than an unbroken one would.
Every checkpoint also carries the run's identity (model, LoRA, router and step configs) so that
a checkpoint written for a different run is refused with a readable message instead of being
loaded into the wrong shapes, or silently into the right shapes with the wrong meaning.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

_FORMAT = "morse_jax.rl.state/1"
_ABSENT = "<absent>"


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


class CheckpointError(ValueError):
  """A checkpoint is missing, unreadable, corrupt or does not match this run."""


def _saveable(state: TrainState) -> dict[str, Any]:
  """Orbax cannot write typed keys, so the key travels as its uint32 data."""
  return {"step": state.step, "experts": state.experts, "router": state.router,
          "opt_states": state.opt_states, "rng": jax.random.key_data(state.rng),
          "cursor": state.cursor}


def _as_json(value: Any) -> Any:
  """What `value` reads back as after a JSON round trip (tuples -> lists, keys -> str)."""
  return json.loads(json.dumps(value))


def _first_difference(saved: Any, current: Any, path: str = "") -> tuple[str, Any, Any] | None:
  """(key path, saved value, current value) of the first difference, in the current order."""
  if isinstance(saved, dict) and isinstance(current, dict):
    for key in [*current, *(k for k in saved if k not in current)]:
      sub = f"{path}.{key}" if path else str(key)
      if key not in saved or key not in current:
        return sub, saved.get(key, _ABSENT), current.get(key, _ABSENT)
      if (found := _first_difference(saved[key], current[key], sub)) is not None:
        return found
    return None
  if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
    for i, (s, c) in enumerate(zip(saved, current)):
      if (found := _first_difference(s, c, f"{path}[{i}]")) is not None:
        return found
    return None
  # True == 1 in Python, but a flag that became a count is a different run.
  if saved == current and isinstance(saved, bool) == isinstance(current, bool):
    return None
  return path or "metadata", saved, current


def _brief(error: Exception) -> str:
  """The first line of an orbax/tensorstore error; the full one stays on `__cause__`."""
  text = str(error).strip().splitlines()
  return (text[0] if text else type(error).__name__)[:300]


def _show(value: Any) -> str:
  return value if value is _ABSENT else json.dumps(value)


def _leaf_name(path: tuple[Any, ...]) -> str:
  """The dotted name orbax gives a leaf (e.g. `opt_states.0.0.mu.q.a`), used in errors."""
  return ".".join(ocp.tree.str_keypath(path))


def _flat(tree: Any, is_leaf=None) -> dict[str, Any]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {_leaf_name(path): leaf for path, leaf in leaves}


class Checkpoints:
  """Saves every `every` steps, keeps the newest `keep`, restores with checks.

  Each step is one orbax step directory holding `state` (the arrays) and `metadata` (JSON: the
  run identity given here plus the PRNG impl). Orbax writes a step under a temporary name
  (`<step>.orbax-checkpoint-tmp...`, AtomicRenameTemporaryPath in
  orbax/checkpoint/_src/path/atomicity.py, the default for local paths) and renames it to
  `<step>` only once every item is written; step listing ignores the temporary names. Together
  with waiting for the save to finish, a crash at any point leaves either the complete new step
  or no new step, never a half-written latest one.
  """

  def __init__(self, directory: str, *, every: int, keep: int, metadata: dict):
    if every < 1 or keep < 1:
      raise ValueError(f"Checkpoints: every and keep must be >= 1, got {every}, {keep}")
    self.directory = os.path.abspath(directory)  # orbax requires absolute paths
    self.every = every
    self.keep = keep
    # Compared after the same JSON round trip the saved copy had; not JSON-able -> TypeError.
    self.metadata = _as_json(metadata)
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_handlers=self._handlers())

  @staticmethod
  def _handlers() -> dict[str, ocp.CheckpointHandler]:
    # Named up front so a fresh manager can read item metadata (shapes) before any save.
    return {"state": ocp.StandardCheckpointHandler(), "metadata": ocp.JsonCheckpointHandler()}

  def maybe_save(self, state: TrainState, *, force: bool = False) -> bool:
    """Saves when the step is a multiple of `every` (or `force`) and not saved yet.

    Blocks until the step is on disk (and older steps beyond `keep` are deleted). Returns
    whether it saved.
    """
    step = int(state.step)
    if (not force and step % self.every) or step in self._manager.all_steps():
      return False
    metadata = {"format": _FORMAT, "rng_impl": str(jax.random.key_impl(state.rng)),
                "run": self.metadata}
    # force=True: the decision is ours; orbax's own policy would also skip steps at or below
    # its latest, e.g. after resuming from an older step.
    saved = self._manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_saveable(state)), metadata=ocp.args.JsonSave(metadata)))
    # Returns once the temporary directory has been renamed to `<step>` (the commit) and the
    # steps beyond `keep` are gone; until then a crash leaves only the ignored temporary name.
    self._manager.wait_until_finished()
    return bool(saved)

  def latest_step(self) -> int | None:
    steps = self._manager.all_steps()
    return max(steps) if steps else None

  def restore(self, template: TrainState, step: int | None = None) -> TrainState:
    """Restores `step` (the latest when None) shaped and placed like `template`.

    Raises CheckpointError when there is no such step, when it was written for another run
    (metadata differs), when an array's shape or dtype differs from the template, or when the
    step is unreadable. Only reads: a failed restore leaves every checkpoint as it was.
    """
    # A separate read-only manager: it lists what is on disk now and cannot delete anything.
    reader = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
        item_handlers=self._handlers())
    try:
      steps = sorted(reader.all_steps())
      if step is None and not steps:
        raise CheckpointError(f"{self.directory}: no checkpoint to restore")
      step = steps[-1] if step is None else step
      if step not in steps:
        raise CheckpointError(f"{self.directory}: no checkpoint at step {step} (have {steps})")
      where = os.path.join(self.directory, str(step))
      rng_impl = self._check_metadata(reader, step, where, template)
      target = jax.tree.map(ocp.utils.to_shape_dtype_struct, _saveable(template))
      self._check_arrays(reader, step, where, target)
      try:
        out = reader.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target)))["state"]
      except Exception as e:  # orbax/tensorstore raise many types for damaged files
        raise CheckpointError(f"checkpoint {where} is unreadable or corrupt: {_brief(e)}") from e
    finally:
      reader.close()
    return TrainState(step=out["step"], experts=out["experts"], router=out["router"],
                      opt_states=out["opt_states"],
                      rng=jax.random.wrap_key_data(out["rng"], impl=rng_impl),
                      cursor=out["cursor"])

  def _check_metadata(self, reader: ocp.CheckpointManager, step: int, where: str,
                      template: TrainState) -> str:
    """Refuses another run's checkpoint before touching arrays; returns the saved rng impl."""
    try:
      saved = reader.restore(step, args=ocp.args.Composite(
          metadata=ocp.args.JsonRestore()))["metadata"]
    except Exception as e:  # missing file, garbage JSON
      raise CheckpointError(f"checkpoint {where}: metadata is unreadable or corrupt: "
                            f"{_brief(e)}") from e
    if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
      raise CheckpointError(f"checkpoint {where} is not a {_FORMAT} checkpoint "
                            f"(metadata {str(saved)[:200]})")
    found = _first_difference(saved.get("run"), self.metadata)
    if found is not None:
      path, was, now = found
      raise CheckpointError(f"checkpoint {where} was written for {path}={_show(was)}, "
                            f"this run has {_show(now)}")
    want = str(jax.random.key_impl(template.rng))
    if saved.get("rng_impl") != want:
      raise CheckpointError(f"checkpoint {where} was written for rng_impl="
                            f"{saved.get('rng_impl')!r}, this run has {want!r}")
    return want

  @staticmethod
  def _check_arrays(reader: ocp.CheckpointManager, step: int, where: str, target: Any) -> None:
    """Names the leaf whose structure, shape or dtype differs (orbax would cast dtypes)."""
    try:
      saved = reader.item_metadata(step)["state"]
    except Exception as e:
      raise CheckpointError(f"checkpoint {where}: array metadata is unreadable or corrupt: "
                            f"{_brief(e)}") from e
    if saved is None:
      raise CheckpointError(f"checkpoint {where}: array metadata is missing")
    is_array = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
    saved = _flat(getattr(saved, "tree", saved), is_leaf=is_array)
    wanted = _flat(target)
    for name in [*wanted, *(n for n in saved if n not in wanted)]:
      if name not in saved or name not in wanted:
        where_not = "the checkpoint" if name not in saved else "this run"
        raise CheckpointError(f"checkpoint {where}: leaf {name} is missing from {where_not}")
      have, want = saved[name], wanted[name]
      if tuple(have.shape) != tuple(want.shape) or have.dtype != want.dtype:
        raise CheckpointError(f"checkpoint {where}: leaf {name} is {have.dtype}"
                              f"{list(have.shape)}, this run has {want.dtype}{list(want.shape)}")

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpoints:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
