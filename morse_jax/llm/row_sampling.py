"""Token choice with per-row sampling settings (the engine's rows each carry their own).

`sampling._choose` takes one static `SamplingConfig` for the batch; here temperature, top-p and
top-k are [b] arrays, and a row draws exactly what `_choose` draws for its settings: the same
filters in the same order (temperature, top-k, top-p on what top-k left), the same inverse-CDF
draw from `uniform(fold_in(key, step))` with step the row's generated-token count. A greedy row
(temperature 0) takes the argmax and the log-prob of the unfiltered distribution.

Filters run only when some row asks for them (`lax.cond`): a bisection over the vocabulary is
the cost of a decode step's matmuls on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from morse_jax.llm.sampling import inverse_cdf, largest_threshold, top_p_threshold


def kth_largest(probs, k):
  """[b, 1]: the k-th largest of each row of non-negative probs (k [b] >= 1; a row with k 0
  gets its max): the largest t with at least k entries >= t (`sampling.largest_threshold`)."""
  return largest_threshold(probs, lambda t: jnp.sum(probs >= t, axis=-1) >= k)


def filtered_logits(logits, temperature, top_p, top_k):
  """`sampling._filter_logits` per row: [b, v] with the removed entries -inf."""
  sampled = temperature > 0
  z = logits / jnp.where(sampled, temperature, 1.0)[:, None]

  def cut_top_k(z):
    kth = kth_largest(jax.nn.softmax(z, axis=-1), top_k)
    keep = (top_k[:, None] == 0) | (jax.nn.softmax(z, axis=-1) >= kth)
    return jnp.where(keep, z, -jnp.inf)

  def cut_top_p(z):
    probs = jax.nn.softmax(z, axis=-1)
    keep = (top_p[:, None] >= 1.0) | (probs >= top_p_threshold(probs, top_p))
    return jnp.where(keep, z, -jnp.inf)

  z = jax.lax.cond(jnp.any(sampled & (top_k > 0)), cut_top_k, lambda z: z, z)
  return jax.lax.cond(jnp.any(sampled & (top_p < 1.0)), cut_top_p, lambda z: z, z)


def choose_rows(logits, keys, step, temperature, top_p, top_k):
  """One token per row and its log-prob under the distribution it was drawn from.

  logits [b, v] float32; keys [b] PRNG keys; step [b] int32 (tokens the row generated so far);
  temperature, top_p [b] float32; top_k [b] int32 (0: off)."""
  greedy_token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  greedy_logp = jax.nn.log_softmax(logits, axis=-1)
  sampled = temperature > 0

  def draw(_):
    logp = jax.nn.log_softmax(filtered_logits(logits, temperature, top_p, top_k), axis=-1)
    uniform = jax.vmap(lambda k, s: jax.random.uniform(jax.random.fold_in(k, s)))(keys, step)
    return inverse_cdf(jnp.exp(logp), uniform).astype(jnp.int32), logp

  token, logp = jax.lax.cond(jnp.any(sampled), draw, lambda _: (greedy_token, greedy_logp), None)
  token = jnp.where(sampled, token, greedy_token)
  logp = jnp.where(sampled[:, None], logp, greedy_logp)
  return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
