"""run_loop: steps until the count, logs each step (offset), saves with the last one forced, and
closes the writer also when a step raises."""

import dataclasses

import pytest

from morse_jax.rl import metrics as metrics_lib
from morse_jax.rl.loop import run_loop


@dataclasses.dataclass(frozen=True)
class Counter:
  step: int


class Saver:
  def __init__(self, every):
    self.every, self.calls, self.saved = every, [], []

  def maybe_save(self, state, *, force=False):
    self.calls.append((state.step, force))
    if force or state.step % self.every == 0:
      self.saved.append(state.step)
      return True
    return False


def test_steps_logs_and_saves(tmp_path):
  saver = Saver(every=2)
  writer = metrics_lib.MetricsWriter(str(tmp_path), progress=False, tensorboard=False)
  state = run_loop(lambda s: (Counter(s.step + 1), {"x": float(s.step)}), Counter(3), steps=8,
                   writer=writer, checkpoints=saver, log_offset=3)
  assert state == Counter(8)
  rows = metrics_lib.read_jsonl(writer.jsonl_path)
  assert [(r["step"], r["x"]) for r in rows] == [(1, 3.0), (2, 4.0), (3, 5.0), (4, 6.0),
                                                 (5, 7.0)]
  assert saver.calls == [(4, False), (5, False), (6, False), (7, False), (8, True)]
  assert saver.saved == [4, 6, 8]
  assert run_loop(lambda s: pytest.fail("nothing left to do"), state, steps=8) == state


def test_writer_closed_when_a_step_raises(tmp_path):
  writer = metrics_lib.MetricsWriter(str(tmp_path), progress=False, tensorboard=False)

  def step_fn(state):
    if state.step == 2:
      raise RuntimeError("killed")
    return Counter(state.step + 1), {"x": 1.0}

  with pytest.raises(RuntimeError, match="killed"):
    run_loop(step_fn, Counter(0), steps=5, writer=writer)
  writer.write(3, {"x": 1.0})  # closed: written nowhere
  assert [r["step"] for r in metrics_lib.read_jsonl(writer.jsonl_path)] == [1, 2]
