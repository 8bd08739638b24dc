"""Summaries of finished tasks: step and problem pass rates, the family's own metrics, and the
paper's node-output heterogeneity (Sim_output)."""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from morse_jax.mas.runner import TaskOutcome


def summarize(outcomes: Sequence[TaskOutcome]) -> dict[str, float]:
  """step_pass: passed nodes / all nodes; mean_step_pass: the mean over tasks of each task's
  share; problem_pass: tasks whose family score passed; step_reward: mean u_i; plus the mean of
  every numeric metric the family reports per problem (e.g. pass@1, eci_mean)."""
  if not outcomes:
    raise ValueError("summarize: no finished tasks")
  passed = [[n.score.passed for n in t.nodes.values()] for t in outcomes]
  out = {
      "tasks": float(len(outcomes)),
      "step_pass": float(np.mean([p for task in passed for p in task])),
      "mean_step_pass": float(np.mean([np.mean(task) for task in passed])),
      "problem_pass": float(np.mean([bool(t.score and t.score.passed) for t in outcomes])),
      "step_reward": float(np.mean([r for t in outcomes for r in t.step_rewards()])),
  }
  keys = sorted({k for t in outcomes if t.score for k in t.score.metrics})
  for k in keys:
    values = [float(t.score.metrics[k]) for t in outcomes if t.score and k in t.score.metrics]
    out[f"family/{k}"] = float(np.mean(values))
  return out


def heterogeneity(outcomes: Sequence[TaskOutcome],
                  embed: Callable[[Sequence[str]], np.ndarray]) -> float | None:
  """Sim_output: per task, the mean pairwise cosine similarity of its node outputs under a
  frozen sentence encoder, averaged over tasks with at least two nodes (lower = more
  heterogeneous outputs). None when no task has two nodes."""
  per_task = []
  for task in outcomes:
    texts = [n.artifact for n in task.nodes.values()]
    if len(texts) < 2:
      continue
    e = np.asarray(embed(texts), np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
    per_task.append(np.mean([e[i] @ e[j] for i, j in itertools.combinations(range(len(e)), 2)]))
  return float(np.mean(per_task)) if per_task else None
