"""Policy and router losses. Only tokens the policy generated count (mask = 1); prompt and tool
output tokens have mask 0 and never reach a loss.

Each aggregate is a ratio numerator / denominator. `aggregate_parts` returns the two so that a
batch split into micro-batches can divide every micro-batch by the whole batch's denominator and
get exactly the full-batch loss by summing.
"""

from __future__ import annotations

import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_parts(values, mask, mode: str = "token-mean", norm_len: int | None = None):
  """(numerator, denominator) of `aggregate`. Rows without any masked-in token do not count."""
  mask = mask.astype(jnp.float32)
  tokens = jnp.sum(mask, -1)
  if mode == "token-mean":
    return jnp.sum(values * mask), jnp.sum(tokens)
  rows = jnp.sum((tokens > 0).astype(jnp.float32))
  if mode == "seq-mean-token-mean":
    return jnp.sum(jnp.sum(values * mask, -1) / jnp.maximum(tokens, 1.0)), rows
  if mode == "seq-mean-token-sum-norm":
    return jnp.sum(values * mask) / (norm_len or values.shape[-1]), rows
  raise ValueError(f"aggregate: mode {mode!r} not in {AGGREGATIONS}")


def aggregate(values, mask, mode: str = "token-mean", norm_len: int | None = None):
  """values, mask [n, T] -> scalar; i ranges over rows with at least one token.

    token-mean               sum(v m) / sum(m)                  every token weighs the same
    seq-mean-token-mean      mean_i [ sum_t v m / sum_t m ]     every sequence weighs the same
    seq-mean-token-sum-norm  mean_i [ sum_t v m ] / norm_len    (norm_len default T; Dr. GRPO)
  """
  num, den = aggregate_parts(values, mask, mode, norm_len)
  return num / jnp.maximum(den, 1.0)


def k3_kl(logp, logp_ref):
  """Per-token k3 estimator of KL(pi || pi_ref): exp(r) - r - 1 with r = logp_ref - logp (>= 0)."""
  r = logp_ref - logp
  return jnp.exp(r) - r - 1.0


def policy_loss(logp, logp_old, advantages, mask, *, epsilon: float = 0.2,
                epsilon_high: float | None = None, aggregation: str = "token-mean",
                kl_coef: float = 0.0, logp_ref=None, norm_len: int | None = None,
                denominator=None, token_count=None):
  """Token-level clipped surrogate:

    ratio = exp(logp - logp_old)
    loss_t = -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A) + kl_coef * k3_kl

  logp, logp_old, mask: [n, T]; advantages: [n] (one per sequence). Returns (loss, metrics) with
  token means clip_frac (and kl). A micro-batch passes the whole batch's `denominator` (of the
  aggregate) and `token_count` (of the metrics), so that micro-batch results sum to the batch's.
  """
  eps_high = epsilon if epsilon_high is None else epsilon_high
  adv = advantages[:, None]
  ratio = jnp.exp(logp - logp_old)
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + eps_high) * adv
  per_token = -jnp.minimum(unclipped, clipped)
  fmask = mask.astype(jnp.float32)
  metrics = {"clip_frac": jnp.sum((clipped < unclipped) * fmask)}
  if kl_coef:
    if logp_ref is None:
      raise ValueError("policy_loss: kl_coef > 0 needs logp_ref")
    kl = k3_kl(logp, logp_ref)
    per_token = per_token + kl_coef * kl
    metrics["kl"] = jnp.sum(kl * fmask)
  num, den = aggregate_parts(per_token, mask, aggregation, norm_len)
  den = den if denominator is None else denominator
  tokens = jnp.sum(fmask) if token_count is None else token_count
  metrics = {k: v / jnp.maximum(tokens, 1.0) for k, v in metrics.items()}
  return num / jnp.maximum(den, 1.0), metrics


def router_loss(route_logp, cross_advantages, alpha_pi: float = 0.15, mask=None):
  """-alpha_pi * sum_b A_cross_b * log pi(E_b | s): route_logp, cross_advantages [B]; `mask` [B]
  leaves out routes the router did not draw (merge nodes)."""
  weight = cross_advantages if mask is None else cross_advantages * mask
  return -alpha_pi * jnp.sum(weight * route_logp)
