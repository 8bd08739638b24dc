"""Leave out of the update the rows that cannot move it: those of nodes whose rewards are flat.

A node whose reward spread is below `min_std` gets advantage 0 on every row and route
(`advantages.row_advantages`), so without a KL term its rows add 0 to the policy loss, to its
gradient and to the router's. They still cost a forward and backward pass each PPO epoch, and on
the demo about half the nodes are flat. `without_flat_nodes` keeps the other nodes' rows and
records the whole batch's loss denominators on the batch, so the step's loss, gradients and
clip fraction are those of the whole batch exactly (tested), for less compute.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from morse_jax.llm.sampling import bucket, length_bucket
from morse_jax.rl.advantages import MIN_REWARD_STD
from morse_jax.rl.losses import aggregate_parts
from morse_jax.rl.train_step import PolicyBatch


def flat_nodes(rewards, route, valid, routes_per_node: int, min_std: float = MIN_REWARD_STD):
  """Bool [num nodes] (node = route // routes_per_node): rows present and reward std < min_std,
  the same population std and threshold as `row_advantages`."""
  node = np.asarray(route) // routes_per_node
  w = np.asarray(valid, np.float64)
  u = np.asarray(rewards, np.float64)
  count = np.bincount(node, weights=w, minlength=node.max() + 1)
  mean = np.bincount(node, weights=u * w, minlength=count.size) / np.maximum(count, 1)
  var = np.bincount(node, weights=w * (u - mean[node]) ** 2, minlength=count.size)
  return (count > 0) & (np.sqrt(var / np.maximum(count, 1)) < min_std)


def without_flat_nodes(batch: PolicyBatch, *, routes_per_node: int, aggregation: str,
                       min_std: float = MIN_REWARD_STD,
                       rows_multiple: int = 1) -> tuple[PolicyBatch, int]:
  """(the batch with only the rows of nodes whose rewards vary, number of nodes left out).

  Kept rows are padded to a power of two (a multiple of rows_multiple) with copies of a kept row
  marked invalid, and T is cut to the longest kept row's `length_bucket`. The result carries the
  whole batch's `denominator` and `token_count`. Nothing is left out when every node is flat
  (the step then skips itself) or none is. Refused with a KL term: it trains every row.
  """
  if batch.logp_ref is not None:
    raise ValueError("without_flat_nodes: the batch has logp_ref (kl_coef > 0), and the KL term "
                     "trains rows whose advantage is 0")
  host = jax.tree.map(np.asarray, batch)
  valid = host.valid > 0
  node = host.route // routes_per_node
  flat = flat_nodes(host.rewards, host.route, host.valid, routes_per_node, min_std)
  keep = np.flatnonzero(valid & ~flat[node])
  dropped = int(flat.sum())
  if keep.size == 0 or dropped == 0:
    return batch, 0
  denominator, token_count = _denominators(host.loss_mask, aggregation)
  rows = bucket(keep.size, minimum=1)
  rows = math.lcm(rows, rows_multiple) if rows % rows_multiple else rows
  index = np.concatenate([keep, np.full(rows - keep.size, keep[0])])
  real = (np.arange(rows) < keep.size).astype(np.float32)
  length = min(host.tokens.shape[1],
               length_bucket(int(host.attention_mask[keep].sum(axis=1).max())))
  tokens = {k: getattr(host, k)[index, :length] * (real[:, None] if k in ("loss_mask", "logp_old")
                                                     else 1)
            for k in ("tokens", "attention_mask", "loss_mask", "logp_old")}
  out = dataclasses.replace(
      host, **tokens, rewards=host.rewards[index] * real, route=host.route[index],
      valid=host.valid[index] * real, routes=jax.tree.map(lambda x: x[index], host.routes),
      denominator=np.float32(denominator), token_count=np.float32(token_count))
  return out, dropped


def _denominators(loss_mask, aggregation: str) -> tuple[float, float]:
  _, denominator = aggregate_parts(np.zeros(loss_mask.shape, np.float32), loss_mask, aggregation)
  return float(denominator), float(np.sum(loss_mask))
