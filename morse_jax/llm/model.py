"""The decoder as plain functions: `forward(params, config, tokens, ...) -> (logits, cache)`.

Layers run under `jax.lax.scan` over the stacked weights. Batches are left-padded: every row's last
prompt token sits in the same slot, so a decode step writes one cache slot for all rows at once.
Positions are explicit per row, so padding never shifts RoPE.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from typing import Any, Callable, Protocol

from morse_jax.llm.config import LlmConfig, RopeConfig
from morse_jax.llm.params import FusedLayer, LayerParams, Params, fuse_layer

_NEG = -1e30  # finite, so fully masked (padding) query rows give zeros, not NaN


class Adapter(Protocol):
  """What `forward` needs from per-row adapters (morse_jax.lora.Adapter is the one we ship);
  defined here so the backbone does not depend on any adapter package."""

  def for_layer(self, layer: int) -> dict | None:
    """This layer's {target: weights}, or None when the layer is not adapted."""

  def stacked_over(self, num_layers: int) -> dict:
    """{target: weights} with a leading axis over all layers (zeros where not adapted)."""

  def project(self, x, w, bias, weights) -> jax.Array:
    """x [b, t, d] through the frozen w [o, d] (+ bias) and this layer's adapter weights."""

  def delta(self, x, weights) -> jax.Array:
    """What this layer's adapter weights add to a projection of x: [b, t, o] float32 (the fused
    decode layers add it to their slice of one fused matmul)."""

  @property
  def row_data(self) -> Any:
    """The pytree of per-row arrays (leading axis = rows), e.g. each row's route."""

  def map_rows(self, fn: Callable[[jax.Array], jax.Array]) -> "Adapter":
    """The same adapter with `fn` applied to every per-row array (select, repeat, pad rows)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [l, b, k, s, x]: slots next to each other per head, as attention reads them
  v: jax.Array  # [l, b, k, s, x]
  valid: jax.Array  # [b, s] bool: the slot holds a real (non-padding) token
  length: jax.Array  # [] int32: slots written so far, the same for every row
  next_pos: jax.Array  # [b] int32: RoPE position of each row's next real token

  @property
  def max_len(self) -> int:
    return (self.k[0] if isinstance(self.k, tuple) else self.k).shape[-2]


def unstack_cache(cache: KVCache) -> KVCache:
  """k and v as tuples of per-layer [b, k, s, x] arrays, for the unstacked decode loop: each
  layer then updates and reads its own buffer in place, where slicing one stacked array in an
  unrolled layer loop copies a layer's slots (and the update may copy the whole cache) per
  step on XLA:CPU."""
  split = lambda a: tuple(a[i] for i in range(a.shape[0]))
  return dataclasses.replace(cache, k=split(cache.k), v=split(cache.v))


def init_cache(config: LlmConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
  shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
  return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                 valid=jnp.zeros((batch, max_len), bool), length=jnp.zeros((), jnp.int32),
                 next_pos=jnp.zeros((batch,), jnp.int32))


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
  """Inverse frequencies [x/2], including linear and llama3 scaling (as transformers computes)."""
  inv = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  inv = inv.astype(np.float32)
  if rope.type == "linear":
    return inv / rope.factor
  if rope.type == "llama3":
    old = rope.original_max_position_embeddings
    low_wavelen, high_wavelen = old / rope.low_freq_factor, old / rope.high_freq_factor
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


def _rope_tables(positions, config: LlmConfig):
  inv = jnp.asarray(rope_inv_freq(config.rope, config.head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv  # [b, t, x/2]
  angles = jnp.concatenate([angles, angles], axis=-1)  # [b, t, x]
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def _apply_rope(x, cos, sin):
  """rotate_half convention of transformers (halves, not interleaved pairs)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
  return out.astype(x.dtype)


def rms_norm(x, weight, eps):
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight * normed.astype(x.dtype)


def _linear(x, w, b=None):
  y = jnp.einsum("btd,fd->btf", x, w, preferred_element_type=jnp.float32)  # w [out, in]
  if b is not None:
    y = y + b
  return y.astype(x.dtype)


def _attention(q, k, v, mask, config: LlmConfig):
  """q [b,t,h,x], k/v [b,k,s,x], mask [b,t,s] -> [b,t,h*x]. GQA without repeating k/v."""
  b, t = q.shape[:2]
  groups = config.num_heads // config.num_kv_heads
  if t == 1:
    return _decode_attention(q, k, v, mask, config)
  out_dtype = v.dtype
  if jax.default_backend() == "cpu" and q.dtype != jnp.float32:
    # XLA:CPU has no batched bf16 x bf16 -> f32 dot ("Unsupported element type for DotThunk")
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
  q = q.reshape(b, t, config.num_kv_heads, groups, config.head_dim)
  scores = jnp.einsum("btkgx,bksx->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores * (config.head_dim ** -0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksx->btkgx", probs, v, preferred_element_type=jnp.float32)
  return out.reshape(b, t, config.q_size).astype(out_dtype)


def _decode_attention(q, k, v, mask, config: LlmConfig):
  """One query token per row: products and sums that read k and v once. As two batched dots
  (b * k batches of [g, x] x [x, s]) XLA:CPU ran a SmolLM2 decode step's attention 2.5x slower
  (measured at 8 rows, 640 slots)."""
  b = q.shape[0]
  q = q.reshape(b, config.num_kv_heads, config.num_heads // config.num_kv_heads, 1,
                config.head_dim).astype(jnp.float32)
  scores = jnp.sum(q * k[:, :, None].astype(jnp.float32), axis=-1) * (config.head_dim ** -0.5)
  scores = jnp.where(mask[:, None, None, 0, :], scores, _NEG)  # [b, k, g, s]
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.sum(probs[..., None] * v[:, :, None].astype(jnp.float32), axis=-2)  # [b, k, g, x]
  return out.reshape(b, 1, config.q_size).astype(v.dtype)


def _fused_projections(h, lp: FusedLayer, lora, adapter, config: LlmConfig):
  """q, k, v of a FusedLayer: one [in, out] matmul, split, plus each adapted target's delta."""
  y = jnp.einsum("btd,do->bto", h, lp.wqkv, preferred_element_type=jnp.float32)
  if lp.bqkv is not None:
    y = y + lp.bqkv
  q_end, k_end = config.q_size, config.q_size + config.kv_size
  parts = (y[..., :q_end], y[..., q_end:k_end], y[..., k_end:])
  return tuple(_plus_delta(part, target, h, lora, adapter).astype(h.dtype)
               for part, target in zip(parts, ("q", "k", "v")))


def _plus_delta(y, target: str, h, lora, adapter):
  """y (one target's slice of a fused f32 product) plus the target's adapter delta, if any."""
  return y if lora is None or target not in lora else y + adapter.delta(h, lora[target])


def _layer(x, lp: LayerParams | FusedLayer, lora, ctx, kv):
  """One decoder layer.

  lora: None or this layer's {target: adapter weights} (`Adapter.for_layer`; all zeros on
    non-adapted layers under scan). ctx: (cos, sin, mask, config, adapter).
  kv: None (no cache) or (k_all, v_all, layer, start): the whole stacked cache travels in the scan
    carry and is updated in place at [layer, :, :, start]; layer None: k_all and v_all are this
    layer's own [b, k, s, x] buffers (`unstack_cache`).
  """
  cos, sin, mask, config, adapter = ctx

  fused = isinstance(lp, FusedLayer)

  def proj(target, h, w, bias=None):
    if fused:  # w is [in, out]
      y = jnp.einsum("btd,do->bto", h, w, preferred_element_type=jnp.float32)
      y = y if bias is None else y + bias
      return _plus_delta(y, target, h, lora, adapter).astype(h.dtype)
    if lora is None or target not in lora:
      return _linear(h, w, bias)
    return adapter.project(h, w, bias, lora[target])

  b, t, _ = x.shape
  h = rms_norm(x, lp.attn_norm, config.rms_norm_eps)
  if fused:
    q, k, v = _fused_projections(h, lp, lora, adapter, config)
  else:
    q, k, v = proj("q", h, lp.wq, lp.bq), proj("k", h, lp.wk, lp.bk), proj("v", h, lp.wv, lp.bv)
  q = q.reshape(b, t, config.num_heads, config.head_dim)
  k = k.reshape(b, t, config.num_kv_heads, config.head_dim)
  v = v.reshape(b, t, config.num_kv_heads, config.head_dim)
  if config.qk_norm:
    q = rms_norm(q, lp.q_norm, config.rms_norm_eps)
    k = rms_norm(k, lp.k_norm, config.rms_norm_eps)
  q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, k, t, x]
  if kv is not None:
    k_all, v_all, layer, start = kv
    if layer is None:
      k = k_all = jax.lax.dynamic_update_slice(k_all, k.astype(k_all.dtype), (0, 0, start, 0))
      v = v_all = jax.lax.dynamic_update_slice(v_all, v.astype(v_all.dtype), (0, 0, start, 0))
    else:
      k_all = jax.lax.dynamic_update_slice(k_all, k.astype(k_all.dtype)[None],
                                           (layer, 0, 0, start, 0))
      v_all = jax.lax.dynamic_update_slice(v_all, v.astype(v_all.dtype)[None],
                                           (layer, 0, 0, start, 0))
      k, v = k_all[layer], v_all[layer]
    kv = (k_all, v_all)
  x = x + proj("o", _attention(q, k, v, mask, config), lp.wo, lp.bo)
  h = rms_norm(x, lp.mlp_norm, config.rms_norm_eps)
  if fused:
    gate_up = jnp.einsum("btd,df->btf", h, lp.w_gate_up, preferred_element_type=jnp.float32)
    gate, up = (_plus_delta(part, target, h, lora, adapter)
                for part, target in zip(jnp.split(gate_up, 2, axis=-1), ("gate", "up")))
    gate, up = jax.nn.silu(gate.astype(h.dtype)), up.astype(h.dtype)
  else:
    gate, up = jax.nn.silu(proj("gate", h, lp.w_gate)), proj("up", h, lp.w_up)
  x = x + proj("down", gate * up, lp.w_down)
  return x, kv


def unstack_layers(tree):
  """A stacked pytree (layers on axis 0) as a tuple of per-layer pytrees.

  On XLA:CPU every slice of a stacked weight inside a jitted loop is materialised as a copy
  (measured: 30% of a 100M model's decode step). Unstacking the weights once before the decode
  loop pays that once per generate call instead of once per token. `forward` accepts a tuple of
  per-layer LayerParams in place of the stacked params.layers and then loops in Python.
  """
  n = jax.tree.leaves(tree)[0].shape[0]
  return tuple(jax.tree.map(lambda a, i=i: a[i], tree) for i in range(n))


def decode_layers(layers) -> tuple[FusedLayer, ...]:
  """Stacked layers as per-layer FusedLayer copies: what the CPU decode loop runs on (one copy
  per generate call, as `unstack_layers`, also paying for the [in, out] layout and fusion)."""
  return tuple(fuse_layer(lp) for lp in unstack_layers(layers))


def _run_layers(x, layers, ctx, kv, start, remat=False):
  """Scans stacked layers, or loops in Python over a tuple from `unstack_layers`. remat: a
  cache-free scan recomputes each layer in the backward pass (see `forward`)."""
  config, adapter = ctx[3], ctx[4]
  if isinstance(layers, tuple):
    per_layer = kv is not None and isinstance(kv[0], tuple)  # an `unstack_cache` cache
    ks, vs = ([], []) if per_layer else (None, None)
    for i, lp in enumerate(layers):
      lora = None if adapter is None else adapter.for_layer(i)
      if per_layer:
        x, (k_i, v_i) = _layer(x, lp, lora, ctx, (kv[0][i], kv[1][i], None, start))
        ks.append(k_i)
        vs.append(v_i)
        continue
      x, new_kv = _layer(x, lp, lora, ctx, None if kv is None else (*kv, i, start))
      kv = None if kv is None else new_kv
    return x, (tuple(ks), tuple(vs)) if per_layer else kv
  lora = None if adapter is None else adapter.stacked_over(config.num_layers)
  if kv is None:
    body = lambda x, xs: _layer(x, xs[0], xs[1], ctx, None)
    x, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, (layers, lora))
    return x, None

  def body(carry, xs):
    x, k_all, v_all = carry
    lp, lora_layer, layer = xs
    x, (k_all, v_all) = _layer(x, lp, lora_layer, ctx, (k_all, v_all, layer, start))
    return (x, k_all, v_all), None

  xs = (layers, lora, jnp.arange(config.num_layers))
  (x, k_all, v_all), _ = jax.lax.scan(body, (x, *kv), xs)
  return x, (k_all, v_all)


def default_positions(attention_mask, cache: KVCache | None):
  """Per-row positions that skip left padding, continuing from the cache when there is one."""
  base = 0 if cache is None else cache.next_pos[:, None]
  return base + jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


@functools.partial(jax.jit, static_argnames=("config", "last_only", "remat"))
def forward(params: Params, config: LlmConfig, tokens, positions=None, attention_mask=None,
            cache: KVCache | None = None, *, last_only: bool = False,
            adapter: Adapter | None = None, segments=None, remat: bool = False):
  """Runs the decoder.

  Args:
    tokens: [b, t] int token ids.
    positions: [b, t] RoPE positions; by default derived from `attention_mask` (and the cache).
    attention_mask: [b, t], 1 for real tokens, 0 for padding (left padding); default all ones.
    cache: a KVCache; the t tokens are written at slots [cache.length, cache.length + t).
    last_only: return logits for the last slot only ([b, 1, v]), as prefill needs.
    adapter: per-row adapters (`Adapter`, e.g. morse_jax.lora's experts and routes); None for the
      bare backbone.
    segments: [b, t] int, no cache: several sequences in one row that share a prefix. Segment 0
      (the prefix) is seen by every later token; a token of segment k >= 1 sees only segment 0
      and earlier tokens of segment k (rl.shared_prefix). None: one sequence per row.
    remat: without a cache, keep only each layer's input for the backward pass and recompute
      the rest (`jax.checkpoint` per layer): a gradient then holds one layer's attention
      scores at a time instead of every layer's, for one more forward pass.

  Returns:
    (logits [b, t, v] float32, updated cache or None).
  """
  b, t = tokens.shape
  mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
  if positions is None:
    positions = default_positions(mask, cache)
  cos, sin = _rope_tables(positions, config)
  x = jnp.take(params.embed, tokens, axis=0)
  if cache is None:
    slots = jnp.arange(t)
    attn_mask = mask[:, None, :] & (slots[None, :, None] >= slots[None, None, :])
    if segments is not None:
      attn_mask &= (segments[:, None, :] == 0) | (segments[:, :, None] == segments[:, None, :])
    start = 0
  else:
    if segments is not None:
      raise ValueError("forward: segments are for cache-free passes (the update), not decoding")
    start = cache.length
    valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, start))
    q_slots = start + jnp.arange(t)
    k_slots = jnp.arange(cache.max_len)
    attn_mask = valid[:, None, :] & (q_slots[None, :, None] >= k_slots[None, None, :])

  kv = None if cache is None else (cache.k, cache.v)
  x, kv = _run_layers(x, params.layers, (cos, sin, attn_mask, config, adapter), kv, start,
                      remat)
  if last_only:
    x = x[:, -1:]
  x = rms_norm(x, params.final_norm, config.rms_norm_eps)
  head = params.embed if params.lm_head is None else params.lm_head
  logits = jnp.einsum("btd,vd->btv", x, head, preferred_element_type=jnp.float32)
  if cache is not None:
    last_real = jnp.max(jnp.where(mask, positions, -1), axis=1)
    cache = KVCache(k=kv[0], v=kv[1], valid=valid, length=cache.length + t,
                    next_pos=jnp.maximum(cache.next_pos, last_real + 1))
  return logits, cache
