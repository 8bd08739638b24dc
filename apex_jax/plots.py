"""PNG plots of an APEx run from the metrics.jsonl files run_stages and run_ttrl write under
`<workdir>/logs`: one panel per stage (stage<i>_<module>) and one for TTRL, each the mean
rollout reward per update (raw, faint) with its moving average, in the order the run trained
them, and the held-out evaluation before and after on the last panel."""

from __future__ import annotations

import os

import numpy as np

from morse_jax.experiments import plots as mas_plots
from morse_jax.rl.metrics import JSONL_NAME, read_jsonl


def stage_logs(logdir: str) -> list[tuple[str, str]]:
  """(name, metrics.jsonl) of each stage folder in training order, then TTRL's, if written."""
  if not os.path.isdir(logdir):
    return []
  names = sorted((d for d in os.listdir(logdir) if d.startswith("stage")),
                 key=lambda d: int(d[len("stage"):].split("_", 1)[0]))
  names += ["ttrl"] if os.path.isdir(os.path.join(logdir, "ttrl")) else []
  out = [(n, os.path.join(logdir, n, JSONL_NAME)) for n in names]
  return [(n, p) for n, p in out if os.path.exists(p)]


def reward_curves(logdir: str, path: str, key: str = "reward_mean", weight: float = 0.8,
                  held_out: dict | None = None) -> str:
  """Writes the panels to `path` (PNG); returns it. Raises if no stage wrote a metric. Each
  panel: the per-update reward raw (faint) and its EMA (`morse_jax.experiments.plots.ema`).
  held_out: {"label": ..., "before": value, "after": value} (e.g. held-out F1 of the untrained
  and the full system), drawn on the last panel at update 0 and at its last update."""
  from matplotlib.ticker import MaxNLocator

  plt = mas_plots._pyplot()
  logs = [(n, [r for r in read_jsonl(p) if r.get(key) is not None]) for n, p in stage_logs(logdir)]
  logs = [(n, rows) for n, rows in logs if rows]
  if not logs:
    raise ValueError(f"reward_curves: no {key!r} in any stage log under {logdir}")
  fig, axes = plt.subplots(1, len(logs), figsize=(3.2 * len(logs), 2.8), squeeze=False)
  for ax, (name, rows) in zip(axes[0], logs):
    x = np.asarray([r["step"] for r in rows])
    y = np.asarray([r[key] for r in rows], np.float64)
    mas_plots.curve(ax, x, y, weight=weight, label="per update")
    ax.set_title(name.split("_", 1)[-1] if name.startswith("stage") else name)
    ax.set_xlabel("update")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.05, 1.05)
  if held_out:
    last = axes[0][len(logs) - 1]
    points = [(0, held_out["before"])] if held_out.get("before") is not None else []
    if held_out.get("after") is not None:
      points.append((int(logs[-1][1][-1]["step"]), held_out["after"]))
    mas_plots.held_out_points(last, points, held_out.get("label", "held-out"))
    last.legend(fontsize=7)
  axes[0][0].set_ylabel("mean rollout reward")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
