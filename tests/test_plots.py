"""Training plots are drawn from metrics.jsonl."""

import os

import pytest

from morse_jax.mas import plots
from morse_jax.rl import metrics


def test_plots_are_written(tmp_path):
  with metrics.MetricsWriter(str(tmp_path), tensorboard=False, progress=False) as w:
    for step in range(1, 4):
      w.write(step, {"reward_mean": 0.1 * step, "problem_pass": 0.5,
                     "expert_usage": [8, 0, 3, 5]})
  paths = plots.training_plots(str(tmp_path / "metrics.jsonl"), str(tmp_path))
  assert [os.path.basename(p) for p in paths] == ["step_reward.png", "problem_pass.png",
                                                  "route_usage.png"]
  assert all(os.path.getsize(p) > 1000 for p in paths)
  with open(tmp_path / "empty.jsonl", "w"):
    pass
  with pytest.raises(ValueError, match="has no metrics"):
    plots.training_plots(str(tmp_path / "empty.jsonl"), str(tmp_path))
