"""Token log-probs of the policy, one place for the update, the old-log-prob recompute and the
reference (adapters off) recompute.

The temperature is applied once, in `log_softmax`: logits / T, with greedy sampling (T = 0)
scored at T = 1 (`scoring_temperature`), as the sampler records greedy tokens' log-probs.

The logits exist `LOGIT_CHUNK` tokens at a time: the forward pass stops at the hidden states
and each chunk is multiplied by the head, log-softmaxed and reduced to its picked log-probs and
entropies inside a checkpointed scan, so the backward pass recomputes one chunk's [n, c, v]
float32 logits instead of keeping the whole [n, T, v] (at a 151936-word vocabulary and 32768
tokens, 18.6 GiB per row for each of the four copies a gradient holds).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.model import forward, head_logits, head_of
from morse_jax.llm.vl import ImageRows, embed_rows
from morse_jax.lora.mixture import Adapter
from morse_jax.rl.shared_prefix import SharedPrefix

LOGIT_CHUNK = 512  # tokens whose logits exist at once


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


def _chunks(x, c: int):
  """[n, T, ...] -> [T / c, n, c, ...], T padded with zeros up to a multiple of c."""
  pad = (-x.shape[1]) % c
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return x.reshape(x.shape[0], -1, c, *x.shape[2:]).swapaxes(0, 1)


def _unchunk(x, length: int):
  """[T / c, n, c] -> [n, T] (the padding cut)."""
  return x.swapaxes(0, 1).reshape(x.shape[1], -1)[:, :length]


def head_logprobs(hidden, head, targets, temperature: float = 1.0, chunk: int = LOGIT_CHUNK):
  """hidden [n, T, d] (the model's final-normed states), head [v, d], targets [n, T] ->
  ([n, T] log p(targets[:, t]) under softmax(hidden[:, t] head^T / temperature), [n, T] entropy
  of that distribution), c = min(chunk, T) tokens' logits at a time (recomputed, not kept, for
  the backward pass)."""
  length = hidden.shape[1]
  c = min(chunk, length)

  def one(args):
    h, tgt = args
    logp = log_softmax(head_logits(h, head), temperature)  # [n, c, v]
    return jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0], entropy(logp)

  if c == length:  # one chunk: nothing to save by recomputing it
    return one((hidden, targets))
  picked, ent = jax.lax.map(jax.checkpoint(one), (_chunks(hidden, c), _chunks(targets, c)))
  return _unchunk(picked, length), _unchunk(ent, length)


def token_logprobs(params, config: LlmConfig, adapter: Adapter | None, tokens, attention_mask,
                   temperature: float = 1.0, remat: bool = False, chunk: int = LOGIT_CHUNK,
                   images: ImageRows | None = None):
  """([n, T] log p(tokens[:, t] | tokens[:, :t]), [n, T] entropy of that distribution), both 0
  at t = 0, under softmax(logits / temperature) of the adapted model. remat: see `forward`;
  chunk: see `head_logprobs`; images: a Qwen2.5-VL batch's (`PolicyBatch.images`)."""
  embeds = positions = None
  if images is not None:
    embeds, positions = embed_rows(params.embed, tokens, images), images.streams
  hidden, _ = forward(params, config, tokens, positions, attention_mask, adapter=adapter,
                      remat=remat, hidden_only=True, embeds=embeds)
  picked, ent = head_logprobs(hidden[:, :-1], head_of(params), tokens[:, 1:], temperature, chunk)
  pad = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
  return pad(picked), pad(ent)


def shared_token_logprobs(params, config: LlmConfig, adapter: Adapter | None,
                          shared: SharedPrefix, temperature: float = 1.0, remat: bool = False,
                          chunk: int = LOGIT_CHUNK):
  """`token_logprobs` of the rows, computed on the packed layout (rl.shared_prefix): ([n, T]
  log-probs, [n, T] entropies), both 0 where a token has no predecessor. A slot's distribution
  predicts every token whose `prev` it is (a prompt's last slot, each of its M suffixes' first
  token), so each chunk of slots gives the log-probs of the tokens whose `prev` falls in it."""
  if adapter is not None:
    adapter = dataclasses.replace(adapter, routes=shared.routes)
  hidden, _ = forward(params, config, shared.tokens, positions=shared.positions,
                      attention_mask=shared.segments >= 0, segments=shared.segments,
                      adapter=adapter, remat=remat, hidden_only=True)
  head, length = head_of(params), hidden.shape[1]
  c = min(chunk, length)
  has_prev = shared.prev >= 0
  packed_rows = jnp.arange(shared.prev.shape[0])[:, None]

  def one(args):
    h, first = args  # [R, c, d], the chunk's first slot
    logp = log_softmax(head_logits(h, head), temperature)  # [R, c, v]
    here = has_prev & (shared.prev >= first) & (shared.prev < first + c)
    slot = jnp.clip(shared.prev - first, 0, c - 1)
    return jnp.where(here, logp[packed_rows, slot, shared.tokens], 0.0), entropy(logp)

  if c == length:  # one chunk: nothing to save by recomputing it
    picked, ent = one((hidden, 0))
  else:
    firsts = jnp.arange(0, length, c)
    picked, ent = jax.lax.map(jax.checkpoint(one), (_chunks(hidden, c), firsts))
    picked = jnp.sum(picked, axis=0)  # [R, S]: each token's log-prob from its prev's chunk
    ent = _unchunk(ent, length)  # [R, S] of each slot's prediction
  picked_entropy = jnp.where(has_prev, ent[packed_rows, jnp.maximum(shared.prev, 0)], 0.0)
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
