"""Training plots are drawn from metrics.jsonl."""

import os

import pytest

from morse_jax.experiments import plots
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


def test_ema_by_hand():
  # s0 = 1; s1 = 0.5 * 1 + 0.5 * 0 = 0.5; s2 = 0.5 * 0.5 + 0.5 * 1 = 0.75
  assert plots.ema([1.0, 0.0, 1.0], 0.5).tolist() == [1.0, 0.5, 0.75]
  assert plots.ema([0.2, 0.9], 0.0).tolist() == [0.2, 0.9]  # weight 0: the raw points
  with pytest.raises(ValueError, match="weight must be in"):
    plots.ema([1.0], 1.0)


def _run(path, rewards):
  with metrics.MetricsWriter(str(path), tensorboard=False, progress=False) as w:
    for step, r in enumerate(rewards, 1):
      w.write(step, {"reward_mean": r, "problem_pass": r / 2})
  return str(path / "metrics.jsonl")


def _axes_of(monkeypatch):
  """The matplotlib axes each plot call drew (captured at savefig)."""
  import matplotlib.figure

  drawn, real = [], matplotlib.figure.Figure.savefig

  def savefig(fig, *a, **kw):
    drawn.append([[(line.get_xdata().tolist(), line.get_ydata().tolist(), line.get_label())
                   for line in ax.get_lines()] for ax in fig.axes])
    return real(fig, *a, **kw)

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
  return drawn


def test_training_plots_smooth_and_show_held_out_points(tmp_path, monkeypatch):
  drawn = _axes_of(monkeypatch)
  jsonl = _run(tmp_path, [0.0, 1.0, 0.0, 1.0])
  plots.training_plots(jsonl, str(tmp_path), {"reward_mean": [(0, 0.3), (4, 0.6)]}, weight=0.5)
  raw, smooth, held = drawn[0][0]  # step_reward.png: one axis, three lines
  assert raw[:2] == ([1, 2, 3, 4], [0.0, 1.0, 0.0, 1.0])
  assert smooth[1] == [0.0, 0.5, 0.25, 0.625]  # EMA 0.5
  assert held[:2] == ([0, 4], [0.3, 0.6]) and held[2] == "held-out tasks"
  assert len(drawn[1][0]) == 2  # problem_pass.png: no held-out points given


def test_variant_panels_one_panel_per_run(tmp_path, monkeypatch):
  drawn = _axes_of(monkeypatch)
  runs = {name: _run(tmp_path / name, rewards) for name, rewards in (
      ("single", [0.1, 0.2]), ("mole_grpo", [0.3, 0.1, 0.5]), ("mole_hgrpo", [0.4, 0.6]))}
  path = plots.variant_panels(runs, str(tmp_path / "variants.png"),
                              held_out={"mole_hgrpo": [(0, 0.2), (2, 0.7)]})
  assert os.path.getsize(path) > 1000
  panels = drawn[0]
  assert len(panels) == 3 and [len(p) for p in panels] == [2, 2, 3]
  assert panels[1][0][1] == [0.3, 0.1, 0.5] and panels[2][2][1] == [0.2, 0.7]
  seeds = {f"seed {k}": _run(tmp_path / f"s{k}", r) for k, r in ((0, [0.1, 0.3]), (1, [0.9]))}
  drawn.clear()
  plots.variant_panels({"mole_hgrpo": seeds}, str(tmp_path / "seeds.png"))
  lines = drawn[0][0]  # raw and EMA per seed, in order
  assert [c[1] for c in lines[::2]] == [[0.1, 0.3], [0.9]]
  assert [c[2] for c in lines[1::2]] == ["seed 0: EMA 0.8", "seed 1: EMA 0.8"]
  with pytest.raises(ValueError, match="'empty' .* has no 'reward_mean'"):
    with open(tmp_path / "empty.jsonl", "w"):
      pass
    plots.variant_panels({"empty": str(tmp_path / "empty.jsonl")}, str(tmp_path / "x.png"))


def test_apex_reward_curves_draw_the_held_out_f1_on_the_last_panel(tmp_path, monkeypatch):
  from apex_jax import plots as apex_plots

  drawn = _axes_of(monkeypatch)
  logdir = tmp_path / "logs"
  _run(logdir / "stage0_executor", [0.2, 0.4, 0.3])
  _run(logdir / "ttrl", [0.9, 0.8])
  apex_plots.reward_curves(str(logdir), str(tmp_path / "r.png"),
                           held_out={"label": "held-out F1", "before": 0.1, "after": 0.25})
  first, last = drawn[0]
  assert len(first) == 2  # raw and EMA
  assert last[2][:2] == ([0, 2], [0.1, 0.25]) and last[2][2] == "held-out F1"
