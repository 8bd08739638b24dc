"""The one training loop: a step function called until the state's step count is reached, each
update's metrics logged and the state checkpointed when due.

  state = run_loop(step_fn, state, steps=100, writer=MetricsWriter(logdir, total_steps=100),
                   checkpoints=Checkpoints(directory, every=10, keep=2, metadata=meta))

`step_fn(state) -> (state, metrics)` makes one update, or several (MoRSE's `pipeline.train`: one
batch of tasks, one update per DAG wave), and returns a state whose `step` moved on by the number
of updates (`TrainState`, or anything with an integer `step`); `metrics` is one mapping, or a
list of them, one per update. MoRSE's `pipeline.train` and `trainer.fit`, APEx's stages
(`apex_jax.training.stages`) and TTRL (`apex_jax.training.ttrl`) run on it; resuming is the
caller's (restore, then start the loop from the restored state): the loop only goes on from the
state it is given.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

State = TypeVar("State")
Metrics = Mapping[str, Any]


class Saver(Protocol):
  """What saves the loop's state: `morse_jax.checkpoint.Checkpoints` (every N, keep k, run
  metadata checked on restore), `checkpoint.RunCheckpoints` (with a sidecar), or
  `SinceLastSave` around either."""

  def maybe_save(self, state: Any, *, force: bool = False) -> bool: ...


class SinceLastSave:
  """A saver due once at least `every` steps have passed since its last save (or forced).

  For step functions that make several updates per call: their steps can jump over a multiple
  of `every`, which `Checkpoints(every=...)` alone would then never save. `start` is the step
  the loop starts from (fresh or restored), counted as saved."""

  def __init__(self, saver: Saver, *, every: int, start: int):
    self.saver, self.every, self.last_saved = saver, every, start

  def maybe_save(self, state: Any, *, force: bool = False) -> bool:
    step = int(state.step)
    if step == self.last_saved or (not force and step - self.last_saved < self.every):
      return False
    self.last_saved = step  # tried: a save another writer holds is not retried every call
    return self.saver.maybe_save(state, force=True)


def run_loop(step_fn: Callable[[State], tuple[State, Metrics | Sequence[Metrics]]],
             state: State, *, steps: int, writer=None, checkpoints: Saver | None = None,
             log_offset: int = 0, should_stop: Callable[[State], bool] | None = None) -> State:
  """Calls step_fn until `state.step` reaches `steps`, or until `should_stop(state)` (asked
  before each call, e.g. a time budget) says to stop. After each call the metrics go to `writer`
  (a MetricsWriter: JSONL, TensorBoard, progress bar), each update's at its own step less
  `log_offset` (a phase of a longer run logs its own steps), then `checkpoints.maybe_save` runs,
  forced once `steps` is reached (the saver decides whether another step is due). A stopped
  loop's last state is saved (forced) unless it already was. The writer is closed when the
  loop ends, also when a step raises."""
  saved_at = int(state.step)  # the state given counts as saved (fresh, or restored from disk)
  try:
    while int(state.step) < steps:
      if should_stop is not None and should_stop(state):
        if checkpoints is not None and int(state.step) != saved_at:
          checkpoints.maybe_save(state, force=True)
        break
      state, metrics = step_fn(state)
      step = int(state.step)
      updates = [metrics] if isinstance(metrics, Mapping) else list(metrics)
      if writer is not None:
        for update_step, update_metrics in enumerate(updates, step - len(updates) + 1):
          writer.write(update_step - log_offset, update_metrics)
      if checkpoints is not None and checkpoints.maybe_save(state, force=step >= steps):
        saved_at = step
  finally:
    if writer is not None:
      writer.close()
  return state
