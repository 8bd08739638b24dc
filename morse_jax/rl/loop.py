"""The one training loop: a step function called until the state's step count is reached, each
step's metrics logged and the state checkpointed when due.

  state = run_loop(step_fn, state, steps=100, writer=MetricsWriter(logdir, total_steps=100),
                   checkpoints=Checkpoints(directory, every=10, keep=2, metadata=meta))

`step_fn(state) -> (state, metrics)` does one update and returns a state whose `step` moved on by
one (`TrainState`, or anything with an integer `step`). MoRSE's `trainer.fit`, APEx's stages
(`apex_jax.training.stages`) and TTRL (`apex_jax.training.ttrl`) run on it; resuming is the
caller's (restore, then start the loop from the restored state): the loop only goes on from the
state it is given.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, TypeVar

State = TypeVar("State")


class Saver(Protocol):
  """What saves the loop's state: `morse_jax.rl.state.Checkpoints` (every N, keep k, run
  metadata checked on restore), or APEx's `training.resume.RunCheckpoints` (with a sidecar)."""

  def maybe_save(self, state: Any, *, force: bool = False) -> bool: ...


def run_loop(step_fn: Callable[[State], tuple[State, Mapping[str, Any]]], state: State, *,
             steps: int, writer=None, checkpoints: Saver | None = None,
             log_offset: int = 0) -> State:
  """Calls step_fn until `state.step` reaches `steps`. After each call the metrics go to
  `writer` (a MetricsWriter: JSONL, TensorBoard, progress bar) at `state.step - log_offset`
  (a phase of a longer run logs its own steps), then `checkpoints.maybe_save` runs, forced on
  the last step (the saver decides whether another step is due). The writer is closed when the
  loop ends, also when a step raises."""
  try:
    while int(state.step) < steps:
      state, metrics = step_fn(state)
      step = int(state.step)
      if writer is not None:
        writer.write(step - log_offset, metrics)
      if checkpoints is not None:
        checkpoints.maybe_save(state, force=step == steps)
  finally:
    if writer is not None:
      writer.close()
  return state
