"""A training run's life in one place: what makes it this run (its identity), and its checkpoints
and metrics from open to close. MoRSE's training (`experiments.pipeline.train`), APEx's stages
and TTRL keep only their step functions and what is theirs (stage boundaries, the bank):

  meta = record(model=model, lora=lora, step=step, stages=[s.config for s in stages])
  with Run(directory, metadata=meta, identity=record(stages=meta, rng=key), every=1, keep=2,
           payload=lambda: {"history": history}) as run:
    state = run.restore(template)  # the newest sound step (and its payload), or the template
    state = run.loop(step_fn, state, steps=10, logdir=logdir)

`record` is the one builder of what checkpoints record and compare (`Checkpoints`' metadata, the
identity that owns a run's folder, the MoRSE demo's measurement identity): each part as JSON
reads it back (`checkpoint.as_json`, the one normalisation), a dataclass as its fields but
those that change how a step is computed, not its result (`train_step.EXECUTION_ONLY`:
`StepConfig`'s micro_batches and remat, `RolloutConfig.engine`), an array (a PRNG key) as
the fingerprint of its data. The records are the ones runs have always written, key for key, so
earlier runs' folders still restore (tests/rl/test_run.py computes them the old way too).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from morse_jax.checkpoint.sidecar import RunCheckpoints, Sidecar, restore_newest
from morse_jax.checkpoint.steps import Checkpoints, as_json, fingerprint
from morse_jax.rl.loop import SinceLastSave, run_loop
from morse_jax.rl.metrics import MetricsWriter
from morse_jax.rl.train_step import EXECUTION_ONLY, StepConfig


def record(**parts) -> dict:
  """The identity record of `parts`, in their order (see the module docstring)."""
  return as_json({name: _part(value) for name, value in parts.items()})


def _part(value: Any) -> Any:
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {k: v for k, v in dataclasses.asdict(value).items() if k not in EXECUTION_ONLY}
  if isinstance(value, (list, tuple)):
    return [_part(v) for v in value]
  if isinstance(value, (jax.Array, np.ndarray)):
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
      value = jax.random.key_data(value)
    return fingerprint(np.asarray(value).tolist())
  return value


class Run:
  """One run's checkpoints in `directory` (None: none) and the loops that go on over them.

  `metadata`: what every step must match to restore; `identity`: the run that owns the folder
  (another is refused unless `continue_other_run`; `checkpoint.Checkpoints`). `payload`: what
  each saved step keeps beside its arrays (a callable; `checkpoint.sidecar`, with `bank`
  snapshotted too), put back on restore in `self.payload`. Steps are saved at multiples of
  `every`, or with `since_last_save` once `every` updates passed since the last save (for step
  functions that make several updates per call and can jump over a multiple), and at the end.
  """

  def __init__(self, directory: str | None, *, metadata: dict, identity: dict, every: int = 1,
               keep: int = 2, continue_other_run: bool = False,
               payload: Callable[[], dict] | None = None, bank=None,
               sidecar_required: bool = True, since_last_save: bool = False):
    self.ckpt = None if directory is None else Checkpoints(
        directory, every=1 if since_last_save else every, keep=keep, metadata=metadata,
        identity=identity, continue_other_run=continue_other_run)
    self.sidecar = None if self.ckpt is None or payload is None else Sidecar(directory)
    self.every, self.since_last_save = every, since_last_save
    self._payload, self.bank, self.sidecar_required = payload, bank, sidecar_required
    self.payload: dict = {}  # the restored step's (empty when nothing was restored)
    self.restored: int | None = None  # the step restored

  def restore(self, template):
    """The newest sound step in `template`'s shapes (damaged newer ones passed over and moved
    aside), with its payload and bank put back; `template` when there is none."""
    if self.ckpt is None:
      return template
    if self.sidecar is None:
      if self.ckpt.latest_step() is None:
        return template
      state = self.ckpt.restore(template)
    else:
      found = restore_newest(self.ckpt, self.sidecar, template, bank=self.bank,
                             sidecar_required=self.sidecar_required)
      if found is None:
        return template
      state, self.payload = found
    self.restored = int(state.step)
    return state

  def loop(self, step_fn, state, *, steps: int, logdir: str | None, progress: bool = True,
           log_offset: int = 0, should_stop: Callable[[Any], bool] | None = None):
    """`rl.loop.run_loop` from `state` until `steps`: metrics to `<logdir>` (metrics.jsonl,
    TensorBoard, a progress bar if `progress`) at each update's step less `log_offset`, the
    state saved when due. With checkpoints, the metrics file is cut back to the state's step
    first: a killed run's lines past it are dropped (all of them in a fresh run)."""
    resume = None if self.ckpt is None else int(state.step) - log_offset
    writer = MetricsWriter(logdir, total_steps=steps - log_offset, progress=progress,
                           resume_step=resume)
    return run_loop(step_fn, state, steps=steps, writer=writer, checkpoints=self._saver(state),
                    log_offset=log_offset, should_stop=should_stop)

  def _saver(self, state):
    if self.ckpt is None:
      return None
    saver = self.ckpt if self.sidecar is None else RunCheckpoints(self.ckpt, self.sidecar,
                                                                  self._payload, self.bank)
    if self.since_last_save:
      return SinceLastSave(saver, every=self.every, start=int(state.step))
    return saver

  def close(self) -> None:
    if self.ckpt is not None:
      self.ckpt.close()

  def __enter__(self) -> Run:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
