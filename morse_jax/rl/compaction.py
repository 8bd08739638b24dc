"""The same update for less compute: rows that cannot move it are left out, and each group's
common prompt is run once.

`without_flat_nodes`: a node whose reward spread is below `min_std` gets advantage 0 on every
row and route (`advantages.row_advantages`; `advantages.flat_nodes` on the host, evaluated once
per update by `rl.update.Update` and passed here), so without a KL term its rows add 0 to the policy
loss, to its gradient and to the router's. They still cost a forward and backward pass each PPO
epoch, and on the demo about half the nodes are flat. It keeps the other nodes' rows and records
the whole batch's loss denominators on the batch, so the step's loss, gradients and clip
fraction are those of the whole batch exactly (tested), for less compute.

`share_prefixes`: the M candidates of a route share their prompt and experts; the forward pass
runs the prompt once per route rather than once per row (rl.shared_prefix). Same log-probs up to
float summation order (tested).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from morse_jax.llm.sampling import length_bucket
from morse_jax.llm.vl import ImageRows
from morse_jax.lora.mixture import Routes
from morse_jax.rl.advantages import MIN_REWARD_STD, flat_nodes
from morse_jax.rl.batch import PolicyBatch, padded_rows
from morse_jax.rl.losses import aggregate_parts
from morse_jax.rl.shared_prefix import SharedPrefix


def without_flat_nodes(batch: PolicyBatch, *, routes_per_node: int, aggregation: str,
                       min_std: float = MIN_REWARD_STD, rows_multiple: int = 1,
                       flat=None) -> tuple[PolicyBatch, int]:
  """(the batch with only the rows of nodes whose rewards vary, number of nodes left out).

  flat: [at least the batch's nodes] bool, `advantages.flat_nodes` of the batch (the step's
  rule) if the caller has it; None evaluates it here.

  Kept rows are padded to a power of two (a multiple of rows_multiple) with copies of a kept row
  marked invalid, and T is cut to the longest kept row's `length_bucket`. The result carries the
  whole batch's `denominator` and `token_count`. Nothing is left out when every node is flat
  (the step then skips itself) or none is. Refused with a KL term: it trains every row.
  """
  if batch.shared is not None:
    raise ValueError("without_flat_nodes: the batch already has a shared-prefix layout; leave "
                     "rows out first, then share_prefixes")
  if batch.logp_ref is not None:
    raise ValueError("without_flat_nodes: the batch has logp_ref (kl_coef > 0), and the KL term "
                     "trains rows whose advantage is 0")
  host = jax.tree.map(np.asarray, batch)
  if flat is None:  # the step's own rule (float32, same threshold): no row with an advantage
    num_nodes = int(host.route.max()) // routes_per_node + 1  # is ever dropped
    flat = flat_nodes(host.rewards, host.route, host.valid, num_nodes=num_nodes,
                      routes_per_node=routes_per_node, min_std=min_std)
  flat = np.asarray(flat, bool)
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
  images = None if host.images is None else ImageRows(
      features=host.images.features[index], index=cut(host.images.index),
      positions=host.images.positions[index, :, :length])
  out = dataclasses.replace(
      host, tokens=cut(host.tokens), attention_mask=cut(host.attention_mask),
      loss_mask=cut(host.loss_mask) * real[:, None], logp_old=cut(host.logp_old) * real[:, None],
      rewards=host.rewards[index] * real, route=host.route[index], valid=host.valid[index] * real,
      routes=jax.tree.map(lambda x: x[index], host.routes),
      denominator=np.float32(denominator), token_count=np.float32(host.loss_mask.sum()),
      images=images)
  return out, dropped


def share_prefixes(batch: PolicyBatch, *, rows_multiple: int = 1,
                   width: int | None = None) -> PolicyBatch:
  """The batch with `shared` set: one packed row per group of valid rows with the same `route`.

  A group's prefix is its rows' longest common prefix up to the first generated token; each
  row's rest (its suffix: everything it trains on) follows as its own segment. The rows' own
  arrays (tokens, masks, log-probs) are cut to their suffixes, `width` slots (default: the
  longest suffix's `length_bucket`): a fixed width (the trainer passes its generation budget)
  keeps the step's compiled shapes few. Rows of a group must have the same experts (a route's
  candidates do); packed rows are padded to a power of two (a multiple of rows_multiple) and
  their length is the longest one's `length_bucket`. Invalid rows keep nothing. Rows with
  images (`images`) are refused: the packed layout has no image inputs yet.
  """
  if batch.images is not None:
    raise ValueError("share_prefixes: the batch has image inputs (images); the shared layout "
                     "takes text rows only")
  host = jax.tree.map(np.asarray, batch)
  lengths = host.attention_mask.sum(axis=1).astype(int)
  groups = [_Group(rows, _common_prefix(host, lengths, route, rows))
            for route, rows in _route_rows(host, lengths).items()]
  longest_suffix = max(lengths[r] - g.prefix for g in groups for r in g.rows)
  width = width or length_bucket(int(longest_suffix))
  if longest_suffix > width:
    raise ValueError(f"share_prefixes: a row has {longest_suffix} tokens after its group's "
                     f"prefix, more than width={width}")
  shared = _packed_rows(host, groups, lengths, width, rows_multiple)
  own = {k: np.zeros((host.tokens.shape[0], width), getattr(host, k).dtype) for k in (
      "tokens", "attention_mask", "loss_mask", "logp_old", "logp_ref")
         if getattr(host, k) is not None}  # the rows' arrays, cut to their suffixes
  for p, group in enumerate(groups):
    _place(shared, own, p, group, host, lengths)
  return dataclasses.replace(host, shared=shared, **own)


@dataclasses.dataclass(frozen=True)
class _Group:
  """A route's valid rows and the length of their common prefix."""

  rows: list[int]
  prefix: int


def _route_rows(host: PolicyBatch, lengths: np.ndarray) -> dict[int, list[int]]:
  """route -> its valid rows, each checked to be right-padded."""
  groups: dict[int, list[int]] = {}
  for r in np.flatnonzero(host.valid > 0):
    if not host.attention_mask[r, :lengths[r]].all():
      raise ValueError(f"share_prefixes: row {r} is not right-padded (attention_mask "
                       f"{host.attention_mask[r].tolist()})")
    groups.setdefault(int(host.route[r]), []).append(int(r))
  if not groups:
    raise ValueError("share_prefixes: the batch has no valid row")
  return groups


def _mixture(host: PolicyBatch, r: int) -> np.ndarray:
  """Row r's (expert, weight) pairs in expert order: the same mixture in any slot order."""
  order = np.argsort(host.routes.idx[r], kind="stable")
  return np.stack([host.routes.idx[r][order], host.routes.w[r][order]])


def _first_trained(host: PolicyBatch, lengths: np.ndarray, r: int) -> int:
  trained = np.flatnonzero(host.loss_mask[r, :lengths[r]] > 0)
  return int(trained[0]) if trained.size else int(lengths[r])


def _common_prefix(host: PolicyBatch, lengths: np.ndarray, route: int, rows: list[int]) -> int:
  """The rows' longest common prefix up to the first generated token; the rows must have the
  same experts."""
  first = rows[0]
  for r in rows[1:]:
    if not np.array_equal(_mixture(host, r), _mixture(host, first)):
      raise ValueError(f"share_prefixes: rows {first} and {r} of route {route} have different "
                       f"experts ({host.routes.idx[first].tolist()} vs "
                       f"{host.routes.idx[r].tolist()}); a group shares one route")
  # trained tokens stay in their own row's part
  prefix = min(_first_trained(host, lengths, r) for r in rows)
  for r in rows[1:]:
    differ = np.flatnonzero(host.tokens[r, :prefix] != host.tokens[first, :prefix])
    prefix = int(differ[0]) if differ.size else prefix
  return prefix


def _packed_rows(host: PolicyBatch, groups: list[_Group], lengths: np.ndarray, width: int,
                 rows_multiple: int) -> SharedPrefix:
  """The empty layout: a packed row per group (padded to a power of two, a multiple of
  rows_multiple) with its first row's experts, as long as the longest group's `length_bucket`."""
  n = host.tokens.shape[0]
  s = length_bucket(max(g.prefix + int(sum(lengths[r] - g.prefix for r in g.rows))
                        for g in groups))
  packed_rows = padded_rows(len(groups), rows_multiple)
  route_of = np.zeros(packed_rows, np.int32)  # an original row whose experts the packed row uses
  route_of[:len(groups)] = [g.rows[0] for g in groups]
  return SharedPrefix(
      tokens=np.zeros((packed_rows, s), np.int32), positions=np.zeros((packed_rows, s), np.int32),
      segments=np.full((packed_rows, s), -1, np.int32),
      prev=np.full((packed_rows, s), -1, np.int32),
      row=np.zeros(n, np.int32), col=np.zeros((n, width), np.int32),
      routes=Routes(idx=host.routes.idx[route_of], w=host.routes.w[route_of]))


def _place(shared: SharedPrefix, own: dict[str, np.ndarray], p: int, group: _Group,
           host: PolicyBatch, lengths: np.ndarray) -> None:
  """Writes group `group` into packed row p (its prefix, then each row's suffix as segment
  1, 2, ...) and each row's suffix into `own`."""
  rows, prefix = group.rows, group.prefix
  first = rows[0]
  shared.tokens[p, :prefix] = host.tokens[first, :prefix]
  shared.positions[p, :prefix] = np.arange(prefix)
  shared.segments[p, :prefix] = 0
  shared.prev[p, 1:prefix] = np.arange(prefix - 1)
  start = prefix
  for k, r in enumerate(rows, start=1):
    size = lengths[r] - prefix
    end = start + size
    shared.tokens[p, start:end] = host.tokens[r, prefix:lengths[r]]
    shared.positions[p, start:end] = np.arange(prefix, lengths[r])
    shared.segments[p, start:end] = k
    shared.prev[p, start:end] = np.arange(start - 1, end - 1)
    if size:  # the suffix's first token is predicted by the prefix's last (none: a fresh row)
      shared.prev[p, start] = prefix - 1
    shared.row[r], shared.col[r, :size] = p, np.arange(start, end)
    for key, array in own.items():
      array[r, :size] = getattr(host, key)[r, prefix:lengths[r]]
    start = end


@dataclasses.dataclass(frozen=True)
class Compaction:
  """What `for_update` left out, to report the step's metrics as the whole batch's."""

  dropped_nodes: int
  full_rows: float  # valid rows before
  kept_rows: float  # valid rows after

  def whole_batch(self, metrics: dict) -> dict:
    """The step's metrics as on the whole batch: left-out nodes were skipped (their rows had
    advantage 0)."""
    if not self.dropped_nodes:
      return metrics
    metrics = dict(metrics)
    metrics["skipped_nodes"] = metrics["skipped_nodes"] + self.dropped_nodes
    metrics["advantage_abs_mean"] = metrics["advantage_abs_mean"] * self.kept_rows / self.full_rows
    return metrics


def for_update(batch: PolicyBatch, step_config, *, routes_per_node: int, rows_multiple: int = 1,
               share_prompts: bool = True, width: int | None = None,
               flat=None) -> tuple[PolicyBatch, Compaction]:
  """The batch the step should run on: flat nodes (`flat`, see without_flat_nodes) left out
  (without a KL term), then each route's common prompt shared (with one micro-batch; `width`:
  see share_prefixes; not for rows with images). Same update as on `batch` (tested)."""
  full = float(np.sum(np.asarray(batch.valid)))
  dropped = 0
  if step_config.kl_coef == 0:
    batch, dropped = without_flat_nodes(batch, routes_per_node=routes_per_node,
                                        aggregation=step_config.aggregation,
                                        min_std=step_config.min_reward_std,
                                        rows_multiple=rows_multiple, flat=flat)
  if share_prompts and step_config.micro_batches == 1 and batch.images is None:
    batch = share_prefixes(batch, rows_multiple=rows_multiple, width=width)
  return batch, Compaction(dropped, full, float(np.sum(np.asarray(batch.valid))))
