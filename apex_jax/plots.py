"""PNG plots of an APEx run from the metrics.jsonl files run_stages and run_ttrl write under
`<workdir>/logs`: one panel per stage (stage<i>_<module>) and one for TTRL, each the mean
rollout reward per update with its rolling mean, in the order the run trained them."""

from __future__ import annotations

import os

import numpy as np

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


def _rolling(y: np.ndarray, window: int) -> np.ndarray:
  return np.asarray([y[max(0, i - window + 1):i + 1].mean() for i in range(len(y))])


def reward_curves(logdir: str, path: str, key: str = "reward_mean", window: int = 5) -> str:
  """Writes the panels to `path` (PNG); returns it. Raises if no stage wrote a metric."""
  import matplotlib

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator

  logs = [(n, [r for r in read_jsonl(p) if r.get(key) is not None]) for n, p in stage_logs(logdir)]
  logs = [(n, rows) for n, rows in logs if rows]
  if not logs:
    raise ValueError(f"reward_curves: no {key!r} in any stage log under {logdir}")
  fig, axes = plt.subplots(1, len(logs), figsize=(3.2 * len(logs), 2.8), squeeze=False)
  for ax, (name, rows) in zip(axes[0], logs):
    x = np.asarray([r["step"] for r in rows])
    y = np.asarray([r[key] for r in rows], np.float64)
    ax.plot(x, y, marker=".", lw=0.8, label="per update")
    ax.plot(x, _rolling(y, window), lw=2, label=f"mean of last {window}")
    ax.set_title(name.split("_", 1)[-1] if name.startswith("stage") else name)
    ax.set_xlabel("update")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.05, 1.05)
  axes[0][0].set_ylabel("mean rollout reward")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
