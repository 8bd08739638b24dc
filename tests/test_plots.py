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


def test_apex_reward_curves_one_panel_per_stage_in_training_order(tmp_path):
  from apex_jax import plots as apex_plots

  logdir = tmp_path / "logs"
  for name in ("stage0_executor", "stage2_planner", "stage10_extra", "ttrl", "stage1_distiller"):
    with metrics.MetricsWriter(str(logdir / name), tensorboard=False, progress=False) as w:
      for step in range(1, 4):
        w.write(step, {"reward_mean": 0.2 * step})
  os.makedirs(logdir / "stage3_empty")  # a stage that wrote nothing is left out
  assert [n for n, _ in apex_plots.stage_logs(str(logdir))] == [
      "stage0_executor", "stage1_distiller", "stage2_planner", "stage10_extra", "ttrl"]
  path = apex_plots.reward_curves(str(logdir), str(tmp_path / "rewards.png"))
  assert os.path.getsize(path) > 1000
  with pytest.raises(ValueError, match="no 'reward_mean'"):
    apex_plots.reward_curves(str(tmp_path / "nothing"), str(tmp_path / "x.png"))
