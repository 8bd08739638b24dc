"""The update batch: its types (`PolicyBatch`, `RouterBatch`) and the one builder from sampled
rows to it, used by MoRSE's trainer (rl.rollout) and APEx's module updates (apex_jax grpo).

A row is a list of `Segment`s (prompt, generated text, tool output, ...); only generated segments
(those with log-probs) are trained on. `layout` packs the rows right-padded, pads the row count to
a power of two (a multiple of `rows_multiple`) with one-token padding rows, and gives each row its
group id (the route id g of the update) and its uniform expert mixture. `policy_batch` adds the
rewards. `update_batch` is the two in one.

This module sits below `train_step`: rollout and compaction import the batch from here, not from
the jitted step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm.sampling import bucket, length_bucket
from morse_jax.llm.vl import ImageRows
from morse_jax.lora.mixture import Routes, uniform_routes
from morse_jax.rl.shared_prefix import SharedPrefix


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PolicyBatch:
  """Rows = sampled candidates (any order, padding rows allowed). Token arrays are [n, T]."""

  tokens: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array  # 1 on tokens the policy generated; 0 on prompt, tool output, padding
  logp_old: jax.Array  # log-prob of tokens[:, t] when sampled (0 where loss_mask is 0)
  rewards: jax.Array  # [n] the verifier's reward of the row
  route: jax.Array  # [n] int32 global route id g = node * B + b
  valid: jax.Array  # [n] 1 for real rows, 0 for padding
  routes: Routes  # [n, e] each row's experts
  logp_ref: jax.Array | None = None  # [n, T] adapters-off log-probs; needed when kl_coef > 0
  # [] the loss denominator and generated-token count of the batch these rows were taken from,
  # when rows with no signal were left out (compaction.without_flat_nodes); None: these rows'.
  denominator: jax.Array | None = None
  token_count: jax.Array | None = None
  # The rows laid out so that each group's common prompt is run once (compaction.share_prefixes);
  # None: the forward pass runs on tokens / attention_mask as they are.
  shared: SharedPrefix | None = None
  # Qwen2.5-VL rows (rl.vl_inputs.with_images): each row's frozen tower tokens for its image
  # pads and its rotary streams (`vl.ImageRows`, row-major); None: text rows.
  images: ImageRows | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RouterBatch:
  """One entry per global route g (G = nodes x B)."""

  embeddings: jax.Array  # [G, D] router input of the route's node
  subtask_routes: jax.Array  # [G, K] ordered subtask-expert draws (0-based subtask ids)
  mask: jax.Array  # [G] 1 when the router drew the route (0: merge nodes, padding)


@dataclasses.dataclass
class Segment:
  tokens: Sequence[int]
  logprobs: Sequence[float] | None = None  # given: the policy generated it (trained on)


@dataclasses.dataclass
class Packed:
  tokens: np.ndarray  # [n, T] right-padded
  attention_mask: np.ndarray  # [n, T]
  loss_mask: np.ndarray  # [n, T] 1 on generated tokens
  logp_old: np.ndarray  # [n, T] sampling log-probs on generated tokens, else 0


def padded_rows(n: int, multiple: int = 1) -> int:
  """Rows of an update batch for n real rows: a power of two, then a multiple of `multiple`
  (mesh data axis x micro-batches), so that the jitted step sees few shapes."""
  rows = bucket(n, minimum=1)
  return math.lcm(rows, multiple) if rows % multiple else rows


def pack(rows: Sequence[Sequence[Segment]], pad_id: int = 0, length: int | None = None) -> Packed:
  """Concatenates each row's segments; T = `length` or the longest row's `length_bucket`."""
  lengths = [sum(len(s.tokens) for s in row) for row in rows]
  t = length or length_bucket(max(lengths))
  if max(lengths) > t:
    raise ValueError(f"pack: a row has {max(lengths)} tokens, more than length={t}")
  out = Packed(np.full((len(rows), t), pad_id, np.int32), np.zeros((len(rows), t), np.int32),
               np.zeros((len(rows), t), np.float32), np.zeros((len(rows), t), np.float32))
  for i, row in enumerate(rows):
    pos = 0
    for seg in row:
      end = pos + len(seg.tokens)
      out.tokens[i, pos:end] = seg.tokens
      out.attention_mask[i, pos:end] = 1
      if seg.logprobs is not None:
        if len(seg.logprobs) != len(seg.tokens):
          raise ValueError(f"pack: row {i} has a segment of {len(seg.tokens)} tokens with "
                           f"{len(seg.logprobs)} log-probs")
        out.loss_mask[i, pos:end] = 1
        out.logp_old[i, pos:end] = seg.logprobs
      pos = end
  return out


@dataclasses.dataclass
class Layout:
  """Rows packed for an update, before rewards: `rows` = real rows padded (see `layout`)."""

  packed: Packed  # [rows, T]
  route: np.ndarray  # [rows] int32 group (global route) id; 0 on padding rows
  valid: np.ndarray  # [rows] float32 1 for real rows
  routes: Routes  # [rows] uniform mixtures; padding rows take row 0's experts


def layout(rows: Sequence[Sequence[Segment]], group_ids: Sequence[int],
           expert_sets: Sequence[Sequence[int]], *, pad_id: int = 0, rows_multiple: int = 1,
           width: int | None = None) -> Layout:
  """Packs n real rows padded to `padded_rows(n, rows_multiple)` rows (a padding row is one pad
  token); group_ids [n] and expert_sets [n] are the real rows'; `width`: the mixture's slots
  (default: the largest expert set)."""
  n = len(rows)
  if not n:
    raise ValueError("layout: no rows")
  if len(group_ids) != n or len(expert_sets) != n:
    raise ValueError(f"layout: {n} rows, {len(group_ids)} group ids, {len(expert_sets)} expert "
                     "sets (need one of each per row)")
  total = padded_rows(n, rows_multiple)
  packed = pack(list(rows) + [[Segment([pad_id])]] * (total - n), pad_id)
  route = np.zeros(total, np.int32)
  route[:n] = np.asarray(group_ids, np.int32)
  valid = (np.arange(total) < n).astype(np.float32)
  sets = list(expert_sets) + [expert_sets[0]] * (total - n)
  return Layout(packed, route, valid, uniform_routes(sets, width))


def policy_batch(rows: Layout, rewards: Sequence[float],
                 logp_ref: np.ndarray | None = None) -> PolicyBatch:
  """The update's rows: rewards [real rows] (one per real row, in row order; padding rows get
  0); logp_ref [rows, T] when the KL term is on."""
  rewards = np.asarray(rewards, np.float32)
  real = int(np.sum(rows.valid))
  if rewards.shape != (real,):
    raise ValueError(f"policy_batch: rewards has shape {rewards.shape}, expected ({real},) (one "
                     "per sampled row)")
  if not np.all(np.isfinite(rewards)):
    raise ValueError(f"policy_batch: non-finite reward at row "
                     f"{int(np.flatnonzero(~np.isfinite(rewards))[0])}")
  padded = np.zeros(len(rows.valid), np.float32)
  padded[:real] = rewards
  p = rows.packed
  return PolicyBatch(tokens=jnp.asarray(p.tokens), attention_mask=jnp.asarray(p.attention_mask),
                     loss_mask=jnp.asarray(p.loss_mask), logp_old=jnp.asarray(p.logp_old),
                     rewards=jnp.asarray(padded), route=jnp.asarray(rows.route),
                     valid=jnp.asarray(rows.valid), routes=rows.routes,
                     logp_ref=None if logp_ref is None else jnp.asarray(logp_ref))


def update_batch(rows: Sequence[Sequence[Segment]], rewards: Sequence[float],
                 group_ids: Sequence[int], expert_sets: Sequence[Sequence[int]], *,
                 pad_id: int = 0, rows_multiple: int = 1,
                 width: int | None = None) -> PolicyBatch:
  """`policy_batch(layout(rows, ...), rewards)`: sampled rows straight to the update batch."""
  return policy_batch(layout(rows, group_ids, expert_sets, pad_id=pad_id,
                             rows_multiple=rows_multiple, width=width), rewards)
