"""PNG plots of a training run from its metrics.jsonl: step reward, problem pass, and how often
each expert was used; `variant_panels` draws several runs side by side (one panel per variant).

Per-update rewards are noisy (a batch of a few tasks), so every curve is drawn raw and faint
with its exponential moving average on top; held-out evaluations, where a run has them (the
demo's before / after), are drawn as points on the same axis at the update they were taken."""

from __future__ import annotations

import os

import numpy as np

from morse_jax.rl.metrics import read_jsonl


def _series(rows, key):
  steps = [r["step"] for r in rows if r.get(key) is not None]
  return np.asarray(steps), np.asarray([r[key] for r in rows if r.get(key) is not None])


def ema(y, weight: float = 0.8) -> np.ndarray:
  """Exponential moving average, s_0 = y_0, s_t = weight s_{t-1} + (1 - weight) y_t."""
  if not 0 <= weight < 1:
    raise ValueError(f"ema: weight must be in [0, 1), got {weight!r}")
  y = np.asarray(y, np.float64)
  out = np.empty_like(y)
  for t, v in enumerate(y):
    out[t] = v if t == 0 else weight * out[t - 1] + (1 - weight) * v
  return out


def curve(ax, x, y, *, weight: float = 0.8, color=None, label: str | None = None) -> None:
  """The raw points, faint, and their EMA on top."""
  line = ax.plot(x, y, marker=".", lw=0.6, alpha=0.3, color=color)[0]
  ax.plot(x, ema(y, weight), lw=2, color=line.get_color(),
          label=f"{label + ': ' if label else ''}EMA {weight:g}")


def held_out_points(ax, points, label: str = "held-out") -> None:
  """points: [(update, value), ...] drawn as large markers (0: before training)."""
  if points:
    x, y = zip(*points)
    ax.plot(x, y, "D", ms=7, color="black", ls="--", lw=1, label=label)


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt
  return plt


def training_plots(jsonl: str, out_dir: str, held_out: dict | None = None,
                   weight: float = 0.8) -> list[str]:
  """Writes step_reward.png, problem_pass.png and route_usage.png; returns their paths.
  held_out: {"reward_mean" / "problem_pass": [(update, value), ...]} drawn on that panel (the
  demo: held-out step reward and problem pass before and after training)."""
  plt = _pyplot()
  rows = read_jsonl(jsonl)
  if not rows:
    raise ValueError(f"training_plots: {jsonl} has no metrics")
  held_out = held_out or {}
  written = []

  def save(fig, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

  for key, name, label in (("reward_mean", "step_reward.png", "mean step reward"),
                           ("problem_pass", "problem_pass.png", "problem pass")):
    fig, ax = plt.subplots(figsize=(5, 3))
    x, y = _series(rows, key)
    curve(ax, x, y, weight=weight, label="training batch")
    held_out_points(ax, held_out.get(key), "held-out tasks")
    ax.set_xlabel("update")
    ax.set_ylabel(label)
    ax.legend(fontsize=7)
    save(fig, name)
  experts = sorted({k for r in rows for k in r if k.startswith("expert_usage/")},
                   key=lambda k: int(k.split("/")[1]))
  fig, ax = plt.subplots(figsize=(5, 3))
  for k in experts:
    x, y = _series(rows, k)
    ax.plot(x, y, label=f"expert {k.split('/')[1]}")
  ax.set_xlabel("update")
  ax.set_ylabel("rows using the expert")
  if experts:
    ax.legend(fontsize=7, ncol=2)
  save(fig, "route_usage.png")
  return written


def variant_panels(runs: dict, path: str, key: str = "reward_mean",
                   held_out: dict | None = None, weight: float = 0.8,
                   ylabel: str = "mean step reward") -> str:
  """One panel per variant, side by side on one y axis: runs {variant: metrics.jsonl path, or
  {label: path} for several runs of it, e.g. one per seed} (the Table 2 run's fixed_grpo /
  mole_grpo / mole_hgrpo), each run's `key` raw and as its EMA, one curve per run; held_out {variant: [(update, value), ...]}
  as points. Writes the PNG to `path`; returns it. A run whose log has no `key` is refused by
  name."""
  plt = _pyplot()
  if not runs:
    raise ValueError("variant_panels: no runs")
  series = {}
  for name, jsonls in runs.items():
    series[name] = []
    for label, jsonl in (jsonls.items() if isinstance(jsonls, dict) else [(None, jsonls)]):
      x, y = _series(read_jsonl(jsonl), key)
      if not len(x):
        raise ValueError(f"variant_panels: {name!r} ({jsonl}) has no {key!r}")
      series[name].append((label, x, y))
  held_out = held_out or {}
  fig, axes = plt.subplots(1, len(series), figsize=(3.2 * len(series), 2.8), squeeze=False,
                           sharey=True)
  for ax, (name, seeds) in zip(axes[0], series.items()):
    for label, x, y in seeds:
      curve(ax, x, y, weight=weight, label=label)
    held_out_points(ax, held_out.get(name))
    ax.set_title(name)
    ax.set_xlabel("update")
  axes[0][0].set_ylabel(ylabel)
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
