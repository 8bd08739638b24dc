"""Prototype router: which subtask experts a subtask's calls use.

  e = embed("{title}: {description[:120]}")     frozen (backbone_mean or sentence)
  h = e @ proj                                   proj [D, dim], trainable, no bias
  logits_j = cos(h, P_j) / temperature           P [Ks, dim] learnable prototypes
  pi = softmax(logits)

Training draws an ordered top-K route without replacement (Gumbel top-k, i.e. a Plackett-Luce
sample); inference takes the K most probable. The route log-probability is the exact
Plackett-Luce one, log pi(e_1..e_K) = sum_j [log pi_{e_j} - log(1 - sum_{i<j} pi_{e_i})], or the
reference code's approximation sum_j log pi_{e_j} (`sum_log_p`), or the probability of the draw
as `distinct_routes` makes it (`distinct_plackett_luce`, below): the B routes of a node are
redrawn until their expert sets differ, which the plain Plackett-Luce form ignores.
"""

from __future__ import annotations

import itertools

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm import sharding

LOG_PROBS = ("plackett_luce", "sum_log_p", "distinct_plackett_luce")
MERGE_MODES = ("union", "random_subset")


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  dim: int = 128
  top_k: int = 2  # subtask experts per route
  temperature: float | None = None  # None: plain cosine logits
  log_prob: str = "plackett_luce"
  merge_experts: str = "union"  # a merge node's experts: union of its parents', or a subset
  max_resample: int = 8  # tries to make the B routes of a group distinct
  proto_l2: float = 1e-4  # 0 switches a regulariser off
  orthogonality: float = 0.05
  diversity: float = 0.02
  init_std: float = 0.02

  def __post_init__(self):
    if self.dim <= 0 or self.top_k <= 0:
      raise ValueError(f"RouterConfig: dim and top_k must be > 0, got {self.dim!r}, "
                       f"{self.top_k!r}")
    if self.temperature is not None and self.temperature <= 0:
      raise ValueError(f"RouterConfig.temperature must be > 0 or None, got {self.temperature!r}")
    if self.log_prob not in LOG_PROBS:
      raise ValueError(f"RouterConfig.log_prob {self.log_prob!r} not in {LOG_PROBS}")
    if self.merge_experts not in MERGE_MODES:
      raise ValueError(f"RouterConfig.merge_experts {self.merge_experts!r} not in {MERGE_MODES}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RouterParams:
  proj: jax.Array  # [D, dim]
  prototypes: jax.Array  # [Ks, dim]


# Logical axes (llm.sharding.ShardingRules): D is the embedder's width, Ks the subtask experts.
ROUTER_AXES = RouterParams(proj=("embed", "router"), prototypes=("experts", "router"))


def shard_router(params: RouterParams, mesh,
                 rules: sharding.ShardingRules = sharding.ShardingRules()) -> RouterParams:
  """The router's parameters placed on `mesh` by `ROUTER_AXES`."""
  return sharding.shard(params, ROUTER_AXES, mesh, rules)


def init_router(config: RouterConfig, input_dim: int, num_subtask_experts: int,
                key: jax.Array) -> RouterParams:
  if config.top_k > num_subtask_experts:
    raise ValueError(f"RouterConfig.top_k={config.top_k} exceeds num_subtask_experts="
                     f"{num_subtask_experts}")
  kp, kq = jax.random.split(key)
  return RouterParams(
      proj=config.init_std * jax.random.normal(kp, (input_dim, config.dim)),
      prototypes=jax.random.normal(kq, (num_subtask_experts, config.dim)) / np.sqrt(config.dim))


def subtask_text(title: str, description: str) -> str:
  return f"{title}: {description[:120]}"


def unit_rows(x):
  """x / |x| per row, with a finite gradient at x = 0 (padding nodes have zero embeddings;
  the gradient of jnp.linalg.norm there is 0/0, and a masked NaN is still NaN)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-16)


def log_probs(params: RouterParams, emb, config: RouterConfig):
  """[n, D] embeddings -> [n, Ks] log pi."""
  h = unit_rows(emb @ params.proj)
  p = unit_rows(params.prototypes)
  logits = h @ p.T
  if config.temperature is not None:
    logits = logits / config.temperature
  return jax.nn.log_softmax(logits, axis=-1)


def route_log_prob(logp, route, mode: str = "plackett_luce", *,
                   routes_per_node: int | None = None, max_resample: int = 0):
  """logp [n, Ks], route [n, K] ordered expert indices (0-based subtask ids) -> [n].
  distinct_plackett_luce needs routes_per_node (and the sampler's max_resample)."""
  chosen = jnp.take_along_axis(logp, route, axis=-1)  # [n, K]
  if mode == "sum_log_p":
    return chosen.sum(-1)
  if mode == "distinct_plackett_luce":
    if routes_per_node is None:
      raise ValueError("route_log_prob: distinct_plackett_luce needs routes_per_node")
    return distinct_route_log_prob(logp, route, routes_per_node, max_resample)
  if mode != "plackett_luce":
    raise ValueError(f"route_log_prob: mode {mode!r} not in {LOG_PROBS}")
  # log of the mass left before draw j: logsumexp over experts not drawn at steps < j.
  drawn = jax.nn.one_hot(route, logp.shape[-1], dtype=bool)  # [n, K, Ks]
  before = jnp.cumsum(drawn, axis=1) - drawn  # drawn strictly before step j
  remaining = jax.nn.logsumexp(jnp.where(before > 0, -jnp.inf, logp[:, None, :]), axis=-1)
  return (chosen - remaining).sum(-1)


def distinct_route_log_prob(logp, route, routes_per_node: int, max_resample: int):
  """The log-probability of each route under `distinct_routes`' draw, given the routes drawn
  before it for the same node (rows g = node * B + b, in draw order):

    P(r_b | r_<b) = PL(r_b) * (1 - q^(R+1)) / (1 - q)   if set(r_b) is not among the earlier sets
                  = PL(r_b) * q^R                        if it is (the last of R + 1 tries kept)

  with R = max_resample and q = the Plackett-Luce mass of the earlier distinct sets (a set's
  mass: PL summed over its K! orders). R = 0 gives plain Plackett-Luce. logp [n, Ks], route
  [n, K], n a multiple of routes_per_node -> [n]."""
  n, k = route.shape
  b = routes_per_node
  if n % b:
    raise ValueError(f"distinct_route_log_prob: {n} routes is not a multiple of "
                     f"routes_per_node={b}")
  pl = route_log_prob(logp, route)  # [n]
  orders = [route[:, list(p)] for p in itertools.permutations(range(k))]
  set_logp = jax.nn.logsumexp(jnp.stack([route_log_prob(logp, o) for o in orders]), axis=0)
  sets = jnp.sort(route, axis=-1).reshape(n // b, b, k)
  same = jnp.all(sets[:, :, None, :] == sets[:, None, :, :], axis=-1)  # [N, B, B]: j vs b
  earlier = jnp.tril(jnp.ones((b, b), bool), -1).T  # [j, b]: j < b
  first = ~jnp.any(same & earlier[None], axis=1)  # [N, B]: no earlier route has its set
  q = jnp.einsum("njb,nj->nb", (earlier[None] & first[:, :, None]).astype(logp.dtype),
                 jnp.exp(set_logp).reshape(n // b, b))
  q = jnp.clip(q, 0.0, 1.0 - 1e-7)
  seen = ~first  # its set was drawn before
  r = max_resample
  new_factor = jnp.log1p(-q ** (r + 1)) - jnp.log1p(-q)
  seen_factor = r * jnp.log(jnp.maximum(q, 1e-30))
  return pl + jnp.where(seen, seen_factor, new_factor).reshape(n)


def sample_routes(key, logp, k: int):
  """Gumbel top-k: [n, Ks] -> [n, k] ordered draws without replacement (Plackett-Luce)."""
  perturbed = logp + jax.random.gumbel(key, logp.shape)
  return jax.lax.top_k(perturbed, k)[1]


def greedy_routes(logp, k: int):
  return jax.lax.top_k(logp, k)[1]


def distinct_routes(key, logp_row, num_routes: int, k: int, max_resample: int) -> np.ndarray:
  """B ordered routes for one node whose expert sets differ where possible (host loop).

  A draw whose set repeats an earlier one is redrawn up to `max_resample` times, then kept.
  """
  routes, seen = [], set()
  for b in range(num_routes):
    for attempt in range(max_resample + 1):
      key, sub = jax.random.split(key)
      route = np.asarray(sample_routes(sub, logp_row[None], k)[0])
      if frozenset(route.tolist()) not in seen or attempt == max_resample:
        break
    seen.add(frozenset(route.tolist()))
    routes.append(route)
  return np.stack(routes)


def merge_node_experts(parent_routes: Sequence[Sequence[int]], mode: str, k: int,
                       rng: np.random.Generator) -> list[int]:
  """A merge node's subtask experts: the union of its parents' (sorted), or a random k of it.
  The router log-prob of such a route is 0 (it was not drawn from the router)."""
  union = sorted({int(e) for route in parent_routes for e in route})
  if mode == "union":
    return union
  if mode == "random_subset":
    return sorted(rng.choice(union, size=min(k, len(union)), replace=False).tolist())
  raise ValueError(f"merge_node_experts: mode {mode!r} not in {MERGE_MODES}")


def regularisers(params: RouterParams, logp, config: RouterConfig,
                 mask=None) -> dict[str, jax.Array]:
  """Weighted terms (0 when switched off):
    proto_l2      * sum ||P_j||^2
    orthogonality * ||P^ P^T - I||_F^2        (P^ row-normalised prototypes)
    diversity     * KL(mean_n pi_n || uniform) (pushes batch usage toward all experts)
  mask [n]: rows that count in the mean (merge and padding rows do not).
  """
  p = params.prototypes
  pn = unit_rows(p)
  gram = pn @ pn.T
  w = jnp.ones(logp.shape[0]) if mask is None else mask.astype(logp.dtype)
  mean = jnp.sum(jnp.exp(logp) * w[:, None], axis=0) / jnp.maximum(jnp.sum(w), 1.0)
  ks = p.shape[0]
  return {
      "proto_l2": config.proto_l2 * jnp.sum(p * p),
      "orthogonality": config.orthogonality * jnp.sum((gram - jnp.eye(ks)) ** 2),
      "diversity": config.diversity * jnp.sum(mean * (jnp.log(mean + 1e-12) + jnp.log(ks))),
  }
