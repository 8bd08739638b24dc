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

import jax
import numpy as np

from morse_jax.llm.sampling import length_bucket
from morse_jax.rl.advantages import MIN_REWARD_STD, row_advantages
from morse_jax.rl.losses import aggregate_parts
from morse_jax.rl.rollout import padded_rows
from morse_jax.rl.train_step import PolicyBatch


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
  num_nodes = int(host.route.max()) // routes_per_node + 1
  # The step's own rule (float32, same threshold), so no row with an advantage is ever dropped.
  flat = np.asarray(row_advantages(host.rewards, host.route, host.valid, num_nodes=num_nodes,
                                   routes_per_node=routes_per_node, min_std=min_std).node_skipped)
  keep = np.flatnonzero((host.valid > 0) & ~flat[host.route // routes_per_node])
  dropped = int(flat.sum())
  if keep.size == 0 or dropped == 0:
    return batch, 0
  _, denominator = aggregate_parts(np.zeros(host.loss_mask.shape, np.float32), host.loss_mask,
                                   aggregation)
  rows = padded_rows(keep.size, rows_multiple)
  index = np.concatenate([keep, np.full(rows - keep.size, keep[0])])  # pads: copies of a row
  real = (np.arange(rows) < keep.size).astype(np.float32)
  length = min(host.tokens.shape[1],
               length_bucket(int(host.attention_mask[keep].sum(axis=1).max())))
  cut = lambda x: x[index, :length]
  out = dataclasses.replace(
      host, tokens=cut(host.tokens), attention_mask=cut(host.attention_mask),
      loss_mask=cut(host.loss_mask) * real[:, None], logp_old=cut(host.logp_old) * real[:, None],
      rewards=host.rewards[index] * real, route=host.route[index], valid=host.valid[index] * real,
      routes=jax.tree.map(lambda x: x[index], host.routes),
      denominator=np.float32(denominator), token_count=np.float32(host.loss_mask.sum()))
  return out, dropped

