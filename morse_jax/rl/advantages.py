"""Group advantages for one DAG node: B routes x M candidates per route, rewards u [B, M].

Standard deviations are population ones (ddof 0). A group whose spread is 0 gets advantage 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-6
MIN_REWARD_STD = 5e-4  # the authors skip an update when the node's rewards barely differ


@dataclasses.dataclass(frozen=True)
class HgrpoAdvantages:
  within: jnp.ndarray  # [B, M]: trains the experts (route fixed)
  cross: jnp.ndarray  # [B]: trains the router


def _clip(a, clip):
  return a if clip is None else jnp.clip(a, -clip, clip)


def grpo(rewards, eps: float = EPS, clip: float | None = 5.0, normalize: bool = True):
  """Standard GRPO (the paper's ablation): one advantage over all B*M samples of a node,

    A_bm = (u_bm - mean(u)) / (std(u) + eps),   0 when std(u) = 0,

  used for the experts and the router alike. Returns [B, M]. normalize=False keeps the bare
  baseline-subtracted reward (the setting of the paper's Proposition 3.1).
  """
  u = jnp.asarray(rewards, jnp.float32)
  a = u - u.mean()
  if normalize:
    std = u.std()
    a = jnp.where(std > 0, a / (std + eps), 0.0)
  return _clip(a, clip)


def hgrpo(rewards, eps: float = EPS, clip: float | None = 5.0,
          normalize: bool = True) -> HgrpoAdvantages:
  """Hierarchical GRPO:

    A_within_bm = (u_bm - mu_b) / (sigma_b + eps)        0 where sigma_b = 0
    A_cross_b   = (mu_b - mean_b mu_b) / (sigma_C + eps)  0 where sigma_C = 0

  with mu_b, sigma_b the mean and std of route b's M rewards and sigma_C the std of the route
  means. Clipped to +-clip (None: no clip). normalize=False drops the divisions.
  """
  u = jnp.asarray(rewards, jnp.float32)
  mu = u.mean(axis=1)  # [B]
  within, cross = u - mu[:, None], mu - mu.mean()
  if normalize:
    sigma, sigma_c = u.std(axis=1), mu.std()
    within = jnp.where(sigma[:, None] > 0, within / (sigma[:, None] + eps), 0.0)
    cross = jnp.where(sigma_c > 0, cross / (sigma_c + eps), 0.0)
  return HgrpoAdvantages(within=_clip(within, clip), cross=_clip(cross, clip))


ESTIMATORS = ("hgrpo", "grpo")


@dataclasses.dataclass(frozen=True)
class RowAdvantages:
  policy: jnp.ndarray  # [n]: each row's advantage for the expert (LoRA) loss
  route: jnp.ndarray  # [G]: each route's advantage for the router loss
  node_skipped: jnp.ndarray  # [N] bool: a node with rows whose reward spread is below min_std


def _segment_stats(values, segment, weight, count: int):
  """Population mean and std of `values` per segment, rows weighted 0/1 by `weight`."""
  total = jax.ops.segment_sum(weight, segment, count)
  safe = jnp.maximum(total, 1.0)
  mean = jax.ops.segment_sum(values * weight, segment, count) / safe
  var = jax.ops.segment_sum(weight * (values - mean[segment]) ** 2, segment, count) / safe
  return mean, jnp.sqrt(var), total


def row_advantages(rewards, route, valid, *, num_nodes: int, routes_per_node: int,
                   estimator: str = "hgrpo", eps: float = EPS, clip: float | None = 5.0,
                   normalize: bool = True, min_std: float = MIN_REWARD_STD,
                   flat=None) -> RowAdvantages:
  """`hgrpo` / `grpo` for rows in any order, on device (jit- and shard-friendly).

  rewards [n]; route [n] global route ids g = node * B + b; valid [n] 0 for padding rows.
  Per-route and per-node means are segment sums over all rows, so on a mesh whose rows are
  split over devices they are gathered across devices by the compiler.

    hgrpo: policy = A_within of the row; route = A_cross of the route.
    grpo:  policy = the node-wide advantage of the row; route = mean of it over the route's rows.

  A node whose reward std is below `min_std` gets advantage 0 everywhere (the authors skip it);
  `flat` [num_nodes] bool: that rule's result, already evaluated (`flat_nodes`), used as given.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f"row_advantages: estimator {estimator!r} not in {ESTIMATORS}")
  n_routes = num_nodes * routes_per_node
  u = jnp.asarray(rewards, jnp.float32)
  w = jnp.asarray(valid, jnp.float32)
  node = route // routes_per_node
  node_of_route = jnp.arange(n_routes) // routes_per_node
  node_mean, node_std, node_rows = _segment_stats(u, node, w, num_nodes)
  flat = node_std < min_std if flat is None else jnp.asarray(flat, jnp.bool_)
  skipped = flat | (node_rows == 0)  # nodes without rows are padding
  mu_b, sigma_b, route_rows = _segment_stats(u, route, w, n_routes)
  if estimator == "hgrpo":
    policy = u - mu_b[route]
    has_rows = (route_rows > 0).astype(jnp.float32)
    mu_c, sigma_c, _ = _segment_stats(mu_b, node_of_route, has_rows, num_nodes)
    cross = (mu_b - mu_c[node_of_route]) * has_rows
    if normalize:
      policy = jnp.where(sigma_b[route] > 0, policy / (sigma_b[route] + eps), 0.0)
      cross = jnp.where(sigma_c[node_of_route] > 0, cross / (sigma_c[node_of_route] + eps), 0.0)
  else:
    policy = u - node_mean[node]
    if normalize:
      policy = jnp.where(node_std[node] > 0, policy / (node_std[node] + eps), 0.0)
    policy = _clip(policy, clip)
    cross = jax.ops.segment_sum(policy * w, route, n_routes) / jnp.maximum(route_rows, 1.0)
  policy = jnp.where(skipped[node] | (w == 0), 0.0, _clip(policy, clip))
  cross = jnp.where(skipped[node_of_route], 0.0, _clip(cross, clip))
  return RowAdvantages(policy=policy, route=cross, node_skipped=skipped & (node_rows > 0))


def flat_nodes(rewards, route, valid, *, num_nodes: int, routes_per_node: int,
               min_std: float = MIN_REWARD_STD) -> np.ndarray:
  """[num_nodes] bool on the host: the nodes (groups, with routes_per_node=1) that
  `row_advantages` gives advantage 0 because their rewards' spread is below min_std; nodes
  without rows (padding) are not flat. The one rule, in float32 as the step applies it, for
  whoever decides on the host whether rows (or a whole update) can be left out."""
  return np.asarray(row_advantages(rewards, route, valid, num_nodes=num_nodes,
                                   routes_per_node=routes_per_node,
                                   min_std=min_std).node_skipped)
