"""Group advantages for one DAG node: B routes x M candidates per route, rewards u [B, M].

Standard deviations are population ones (ddof 0). A group whose spread is 0 gets advantage 0.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

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


def should_skip(rewards, *advantages, min_std: float = MIN_REWARD_STD) -> bool:
  """True when a node's update carries no signal: every advantage is 0 or the rewards' spread is
  below `min_std` (host-side: decides whether to run the step at all)."""
  u = jnp.asarray(rewards, jnp.float32)
  if float(u.std()) < min_std:
    return True
  return all(not bool(jnp.any(jnp.asarray(a) != 0)) for a in advantages)
