"""run_loop: steps until the count, logs each update (offset; several per call too), saves with
the last one forced, stops when asked (saving the last state), and closes the writer also when a
step raises; SinceLastSave: due once `every` steps passed since its last save."""

import dataclasses

import pytest

from morse_jax.rl import metrics as metrics_lib
from morse_jax.rl.loop import SinceLastSave, run_loop


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


def waves(sizes):
  """A step function making sizes[call] updates per call (MoRSE: one batch, one per wave)."""
  calls = iter(sizes)

  def step_fn(state):
    n = next(calls)
    return Counter(state.step + n), [{"x": float(state.step + i)} for i in range(n)]

  return step_fn


def test_several_updates_per_call_log_each_and_save_since_last(tmp_path):
  saver = Saver(every=1000)  # never due by itself: SinceLastSave decides and forces
  writer = metrics_lib.MetricsWriter(str(tmp_path), progress=False, tensorboard=False)
  state = run_loop(waves([3, 1, 2, 3]), Counter(0), steps=8, writer=writer,
                   checkpoints=SinceLastSave(saver, every=4, start=0))
  assert state == Counter(9)  # the last call's waves go past the count
  rows = metrics_lib.read_jsonl(writer.jsonl_path)
  assert [(r["step"], r["x"]) for r in rows] == [(s, float(s - 1)) for s in range(1, 10)]
  # 3 and 6 are under 4 past the last save; 9 is the last
  assert saver.saved == [4, 9]


def test_should_stop_before_a_call_saves_the_last_state_once():
  saver = Saver(every=1000)
  since = SinceLastSave(saver, every=3, start=5)
  asked = []

  def out_of_time(state):
    asked.append(state.step)
    return len(asked) == 3

  state = run_loop(waves([1, 1]), Counter(5), steps=20, checkpoints=since,
                   should_stop=out_of_time)
  assert state == Counter(7) and asked == [5, 6, 7]
  assert saver.calls == [(7, True)]  # 6 and 7 not due (under 3 past 5); 7 saved on stopping
  # Stopped right after a due save, or before any update (a resumed run): nothing more to save.
  run_loop(waves([3]), Counter(7), steps=20, checkpoints=since,
           should_stop=lambda s: s.step == 10)
  run_loop(waves([]), Counter(10), steps=20, checkpoints=SinceLastSave(saver, every=3, start=10),
           should_stop=lambda s: True)
  assert saver.calls == [(7, True), (10, True)]
