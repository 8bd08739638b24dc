"""Token log-probs of the policy, one place for the update, the old-log-prob recompute and the
reference (adapters off) recompute.

The temperature is applied once, in `log_softmax`: logits / T, with greedy sampling (T = 0)
scored at T = 1 (`scoring_temperature`), as the sampler records greedy tokens' log-probs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.model import forward
from morse_jax.lora.mixture import Adapter
from morse_jax.rl.shared_prefix import SharedPrefix


def scoring_temperature(temperature) -> float:
  """The temperature tokens are scored at: the sampling one, or 1 for greedy (0). Takes a
  number or anything with a `temperature` (an `llm.SamplingConfig`)."""
  t = getattr(temperature, "temperature", temperature)
  return t or 1.0


def log_softmax(logits, temperature: float = 1.0):
  """log softmax(logits / T) in float32, T = `scoring_temperature(temperature)`."""
  t = scoring_temperature(temperature)
  return jax.nn.log_softmax(logits.astype(jnp.float32) / t, axis=-1)


def entropy(logp):
  """-sum_j p_j log p_j over the last axis, p = exp(logp)."""
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def token_logprobs(params, config: LlmConfig, adapter: Adapter | None, tokens, attention_mask,
                   temperature: float = 1.0, remat: bool = False):
  """([n, T] log p(tokens[:, t] | tokens[:, :t]), [n, T] entropy of that distribution), both 0
  at t = 0, under softmax(logits / temperature) of the adapted model. remat: see `forward`."""
  logits, _ = forward(params, config, tokens, attention_mask=attention_mask, adapter=adapter,
                      remat=remat)
  logp = log_softmax(logits[:, :-1], temperature)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  pad = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
  return pad(picked), pad(entropy(logp))


def shared_token_logprobs(params, config: LlmConfig, adapter: Adapter | None,
                          shared: SharedPrefix, temperature: float = 1.0, remat: bool = False):
  """`token_logprobs` of the rows, computed on the packed layout (rl.shared_prefix): ([n, T]
  log-probs, [n, T] entropies), both 0 where a token has no predecessor."""
  if adapter is not None:
    adapter = dataclasses.replace(adapter, routes=shared.routes)
  logits, _ = forward(params, config, shared.tokens, positions=shared.positions,
                      attention_mask=shared.segments >= 0, segments=shared.segments,
                      adapter=adapter, remat=remat)
  logp = log_softmax(logits, temperature)
  ent = entropy(logp)  # [R, S] of each slot's prediction
  has_prev = shared.prev >= 0
  prev = jnp.maximum(shared.prev, 0)
  packed_rows = jnp.arange(prev.shape[0])[:, None]
  picked = jnp.where(has_prev, logp[packed_rows, prev, shared.tokens], 0.0)
  picked_entropy = jnp.where(has_prev, ent[packed_rows, prev], 0.0)
  rows = shared.row[:, None]
  return picked[rows, shared.col], picked_entropy[rows, shared.col]


@functools.partial(jax.jit, static_argnames=("config", "temperature"))
def sequence_logprobs(params, config, adapter, tokens, attention_mask, temperature):
  """[n, T] log p(tokens[:, t]) under the adapted model (jitted `token_logprobs`)."""
  return token_logprobs(params, config, adapter, tokens, attention_mask, temperature)[0]


def recompute(params, config, adapter, tokens, attention_mask, loss_mask, temperature):
  """[n, T] log-probs on the trained tokens (0 elsewhere), as the sampler records them: the old
  policy's when top-k / top-p filtered the sampling distribution, or the reference's (adapter
  None) for the KL term."""
  return sequence_logprobs(params, config, adapter, tokens, attention_mask,
                           scoring_temperature(temperature)) * loss_mask
