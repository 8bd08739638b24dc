"""Metric helpers against hand-worked numbers; MetricsWriter's JSONL, TensorBoard and resume."""

from __future__ import annotations

import glob
import json
import math
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax.rl import metrics


def test_reward_stats_by_hand():
  out = metrics.reward_stats(np.array([1.0, 1.0, 0.0, 1.0]), np.array([0, 0, 1, 1]))
  # mean 0.75; var = mean((r - .75)^2) = (3 * .0625 + .5625) / 4 = .1875; group 0 is constant.
  assert out["reward_mean"] == pytest.approx(0.75)
  assert out["reward_std"] == pytest.approx(math.sqrt(0.1875))
  assert out["frac_reward_zero_std"] == pytest.approx(0.5)


def test_reward_stats_unsorted_groups_and_bad_shapes():
  # groups 7 -> [2, 2], 3 -> [1, 0], 5 -> [4]: two of three groups are constant.
  out = metrics.reward_stats(np.array([2.0, 1.0, 2.0, 0.0, 4.0]), np.array([7, 3, 7, 3, 5]))
  assert out["frac_reward_zero_std"] == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="must both be"):
    metrics.reward_stats(np.zeros(3), np.zeros(4, int))


def test_zero_std_fraction_is_the_updates_rule():
  """A group counts as wasted exactly when the update gives it advantage 0: spread below
  MIN_REWARD_STD (5e-4), not merely below 1e-12."""
  out = metrics.reward_stats(np.array([0.5, 0.5002, 1.0, 0.0]), np.array([0, 0, 1, 1]))
  assert out["frac_reward_zero_std"] == pytest.approx(0.5)  # group 0: std 1e-4
  out = metrics.reward_stats(np.array([0.5, 0.5002]), np.array([0, 0]), min_std=1e-5)
  assert out["frac_reward_zero_std"] == 0.0


def test_expert_usage_counts_rows_and_names_bad_id():
  counts = metrics.expert_usage([[0, 2], [2], [2, 2, 1], []], num_experts=4)
  np.testing.assert_array_equal(counts, [1, 1, 3, 0])
  with pytest.raises(ValueError, match=r"expert_sets\[1\].*expert id 4"):
    metrics.expert_usage([[0], [4]], num_experts=4)


def test_tokens_per_second():
  assert metrics.tokens_per_second(1000, 2.0) == 500.0
  assert metrics.tokens_per_second(1000, 0.0) == 0.0


def _read_tfevents(path: str) -> list:
  """Events of a TFRecord file: [u64 length][u32 crc][data][u32 crc] per record."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel

  events = []
  with open(path, "rb") as f:
    while header := f.read(12):
      (length,) = struct.unpack("<Q", header[:8])
      event = event_pb2.Event()
      event.ParseFromString(f.read(length))
      f.read(4)
      events.append(event)
  return events


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
  assert files and all(os.path.getsize(p) > 0 for p in files)
  out: dict[str, list[tuple[int, float]]] = {}
  for path in files:
    for event in _read_tfevents(path):
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


def test_writer_jsonl_and_tensorboard(tmp_path):
  logdir = str(tmp_path / "run")
  with metrics.MetricsWriter(logdir, total_steps=10, progress=False, process_index=0) as w:
    w.write(1, {"reward_mean": jnp.float32(0.5), "expert_usage": np.array([3, 0, 1]),
                "loss": float("nan"), "count": 7, "kl": jnp.bfloat16(0.125)})
    w.write(2, {"reward_mean": np.float64(0.25), "loss": 1.5})
  assert w.nonfinite_count == 1
  records = metrics.read_jsonl(os.path.join(logdir, "metrics.jsonl"))
  assert records == [
      {"step": 1, "reward_mean": 0.5, "expert_usage/0": 3.0, "expert_usage/1": 0.0,
       "expert_usage/2": 1.0, "loss": None, "count": 7.0, "kl": 0.125},
      {"step": 2, "reward_mean": 0.25, "loss": 1.5},
  ]
  scalars = _scalars(logdir)
  assert scalars["reward_mean"] == [(1, 0.5), (2, 0.25)]
  assert scalars["expert_usage/2"] == [(1, 1.0)]
  assert math.isnan(scalars["loss"][0][1]) and scalars["loss"][1] == (2, 1.5)


def test_writer_flushes_each_line_before_close(tmp_path):
  w = metrics.MetricsWriter(str(tmp_path), tensorboard=False, progress=False, process_index=0)
  w.write(3, {"x": 1.0})
  assert metrics.read_jsonl(str(tmp_path / "metrics.jsonl")) == [{"step": 3, "x": 1.0}]
  w.close()
  w.close()  # idempotent


def test_writer_rejects_non_numeric_naming_the_key(tmp_path):
  with metrics.MetricsWriter(str(tmp_path), progress=False, process_index=0) as w:
    with pytest.raises(ValueError, match=r"'phase' is not numeric: 'warmup'"):
      w.write(1, {"ok": 1.0, "phase": "warmup"})
    with pytest.raises(ValueError, match="reserved"):
      w.write(1, {"step": 1})


def test_writer_on_other_process_writes_nothing(tmp_path):
  logdir = tmp_path / "run"
  with metrics.MetricsWriter(str(logdir), process_index=1) as w:
    w.write(1, {"x": 1.0})
  assert not logdir.exists()


def test_resume_drops_later_lines_and_torn_tail(tmp_path):
  logdir = str(tmp_path)
  path = tmp_path / "metrics.jsonl"
  lines = [json.dumps({"step": s, "x": float(s)}) for s in (1, 2, 3, 4)]
  path.write_text("\n".join(lines) + '\n{"step": 5, "x"')  # killed mid-write at step 5
  with metrics.MetricsWriter(logdir, tensorboard=False, progress=False, process_index=0,
                             resume_step=2) as w:
    w.write(3, {"x": 30.0})
  assert metrics.read_jsonl(str(path)) == [
      {"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}, {"step": 3, "x": 30.0}]
  assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temp file left behind


def test_reopen_without_resume_appends_after_torn_tail(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "x": 1.0}\n{"st')
  with metrics.MetricsWriter(str(tmp_path), tensorboard=False, progress=False,
                             process_index=0) as w:
    w.write(2, {"x": 2.0})
  assert metrics.read_jsonl(str(path)) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]


def test_progress_bar_postfix(tmp_path, capsys):
  with metrics.MetricsWriter(None, total_steps=4, process_index=0) as w:
    w.write(2, {"reward_mean": 0.5, "expert_loss": 0.01234, "tokens_per_s": 1234.6, "z": 1.0})
  err = capsys.readouterr().err
  assert "2/4" in err and "reward=0.500" in err and "loss=0.01234" in err
  assert "tok/s=1235" in err and "z=" not in err
  assert not list(tmp_path.iterdir())
