"""Policy and router losses. Only tokens the policy generated count (mask = 1); prompt and tool
output tokens have mask 0 and never reach a loss."""

from __future__ import annotations

import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(values, mask, mode: str = "token-mean", norm_len: int | None = None):
  """values, mask [n, T] -> scalar.

    token-mean               sum(v m) / sum(m)                  every token weighs the same
    seq-mean-token-mean      mean_i [ sum_t v m / sum_t m ]     every sequence weighs the same
    seq-mean-token-sum-norm  mean_i [ sum_t v m ] / norm_len    (norm_len default T; Dr. GRPO)
  """
  mask = mask.astype(jnp.float32)
  if mode == "token-mean":
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  if mode == "seq-mean-token-mean":
    per_seq = jnp.sum(values * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
    return jnp.mean(per_seq)
  if mode == "seq-mean-token-sum-norm":
    return jnp.mean(jnp.sum(values * mask, -1)) / (norm_len or values.shape[-1])
  raise ValueError(f"aggregate: mode {mode!r} not in {AGGREGATIONS}")


def k3_kl(logp, logp_ref):
  """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = logp_ref - logp (>= 0)."""
  r = logp_ref - logp
  return jnp.exp(r) - r - 1.0


def policy_loss(logp, logp_old, advantages, mask, *, epsilon: float = 0.2,
                epsilon_high: float | None = None, aggregation: str = "token-mean",
                kl_coef: float = 0.0, logp_ref=None, norm_len: int | None = None):
  """Token-level clipped surrogate:

    ratio = exp(logp - logp_old)
    loss_t = -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A) + kl_coef * k3_kl

  logp, logp_old, mask: [n, T]; advantages: [n] (one per sequence). Returns (loss, metrics).
  """
  eps_high = epsilon if epsilon_high is None else epsilon_high
  adv = advantages[:, None]
  ratio = jnp.exp(logp - logp_old)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + eps_high) * adv
  per_token = -jnp.minimum(unclipped, clipped)
  metrics = {"clip_frac": aggregate((clipped < unclipped).astype(jnp.float32), mask)}
  if kl_coef:
    if logp_ref is None:
      raise ValueError("policy_loss: kl_coef > 0 needs logp_ref")
    kl = k3_kl(logp, logp_ref)
    per_token = per_token + kl_coef * kl
    metrics["kl"] = aggregate(kl, mask)
  return aggregate(per_token, mask, aggregation, norm_len), metrics


def router_loss(route_logp, cross_advantages, alpha_pi: float = 0.15):
  """-alpha_pi * sum_b A_cross_b * log pi(E_b | s): route_logp, cross_advantages [B]."""
  return -alpha_pi * jnp.sum(cross_advantages * route_logp)
