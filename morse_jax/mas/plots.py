"""PNG plots of a training run from its metrics.jsonl: step reward, problem pass, and how often
each expert was used."""

from __future__ import annotations

import os

import numpy as np

from morse_jax.rl.metrics import read_jsonl


def _series(rows, key):
  steps = [r["step"] for r in rows if r.get(key) is not None]
  return np.asarray(steps), np.asarray([r[key] for r in rows if r.get(key) is not None])


def training_plots(jsonl: str, out_dir: str) -> list[str]:
  """Writes step_reward.png, problem_pass.png and route_usage.png; returns their paths."""
  import matplotlib

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt

  rows = read_jsonl(jsonl)
  if not rows:
    raise ValueError(f"training_plots: {jsonl} has no metrics")
  written = []

  def save(fig, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

  for key, name, label in (("reward_mean", "step_reward.png", "mean step reward (candidates)"),
                           ("problem_pass", "problem_pass.png", "problem pass (training batch)")):
    fig, ax = plt.subplots(figsize=(5, 3))
    x, y = _series(rows, key)
    ax.plot(x, y, marker=".")
    ax.set_xlabel("update")
    ax.set_ylabel(label)
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
