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

from typing import Any, Callable, NamedTuple, Protocol

from morse_jax.llm import attention, attention_kernels, cpu_matmul
from morse_jax.llm.config import LlmConfig, RopeConfig
from morse_jax.llm.params import LayerParams, Params

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
    CPU decode layers add it to their slice of one fused matmul)."""

  @property
  def row_data(self) -> Any:
    """The pytree of per-row arrays (leading axis = rows), e.g. each row's route."""

  def map_rows(self, fn: Callable[[jax.Array], jax.Array]) -> "Adapter":
    """The same adapter with `fn` applied to every per-row array (select, repeat, pad rows)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [l, b, k, s, x]: slots next to each other per head, as attention reads them
  v: jax.Array  # [l, b, k, s, x]  (the CPU decode loop: tuples of per-layer [b, k, s, x])
  valid: jax.Array  # [b, s] bool: the slot holds a real (non-padding) token
  length: jax.Array  # [] int32: slots written so far, the same for every row
  next_pos: jax.Array  # [b] int32: RoPE position of each row's next real token

  @property
  def max_len(self) -> int:
    return self.valid.shape[1]


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


def mrope_streams(section: tuple[int, ...]) -> np.ndarray:
  """Which position stream (0 temporal, 1 height, 2 width) drives each of the x/2 frequencies:
  section[i] frequencies in turn for stream i % 3 (transformers' Qwen2.5-VL rotary)."""
  return np.concatenate([np.full(n, i % 3, np.int32) for i, n in enumerate(section)])


def _rope_tables(positions, config: LlmConfig):
  """cos and sin [b, t, 1, x] of positions [b, t], or, for an mrope config, [3, b, t] (three
  streams t / h / w; a [b, t] array there is the three streams equal: text)."""
  inv = jnp.asarray(rope_inv_freq(config.rope, config.head_dim))
  positions = positions.astype(jnp.float32)
  if positions.ndim == 3:
    if config.mrope_section is None:
      raise ValueError(f"positions of shape {positions.shape}: three position streams need a "
                       f"config with mrope_section")
    streams = mrope_streams(config.mrope_section)  # [x/2]
    angles = jnp.moveaxis(positions[streams], 0, -1) * inv  # [b, t, x/2]
  else:
    angles = positions[..., None] * inv  # [b, t, x/2]
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


def _attention(q, k, v, vis: attention.Visibility, config: LlmConfig):
  """q [b,t,h,x], k/v [b,k,s,x] -> [b,t,h*x]: `attention_kernels.attend` (blocked online
  softmax, or the platform's kernel), which never holds more than one block of scores. GQA
  without repeating k/v; one-token queries (decode) read only the filled slots' blocks."""
  b, t = q.shape[:2]
  return attention_kernels.attend(q, k, v, vis).reshape(b, t, config.q_size)


class Projections(Protocol):
  """How a layer multiplies by its weights: the four matmul stages of `layer`, each with this
  layer's adapter weights (`lora`: None or {target: weights}). `STORED` reads `LayerParams`
  ([out, in], one matmul per target); `llm.fused_decode` reads its [in, out] fused copies."""

  def qkv(self, h, lp, lora, adapter, config: LlmConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [b, t, h*x], k and v [b, t, k*x] of the normed input h [b, t, d]."""

  def o(self, a, lp, lora, adapter) -> jax.Array:
    """The attention output a [b, t, h*x] back to [b, t, d]."""

  def gate_up(self, h, lp, lora, adapter) -> tuple[jax.Array, jax.Array]:
    """The MLP's gate and up projections (before the activation), [b, t, f] each."""

  def down(self, m, lp, lora, adapter) -> jax.Array:
    """The MLP's down projection of m [b, t, f] to [b, t, d]."""


class StoredProjections:
  """`Projections` of `LayerParams` as stored: [out, in], one matmul per target."""

  @staticmethod
  def _one(target, h, w, bias, lora, adapter):
    if lora is None or target not in lora:
      return _linear(h, w, bias)
    return adapter.project(h, w, bias, lora[target])

  def qkv(self, h, lp, lora, adapter, config):
    return tuple(self._one(t, h, w, b, lora, adapter)
                 for t, w, b in (("q", lp.wq, lp.bq), ("k", lp.wk, lp.bk), ("v", lp.wv, lp.bv)))

  def o(self, a, lp, lora, adapter):
    return self._one("o", a, lp.wo, lp.bo, lora, adapter)

  def gate_up(self, h, lp, lora, adapter):
    return (self._one("gate", h, lp.w_gate, None, lora, adapter),
            self._one("up", h, lp.w_up, None, lora, adapter))

  def down(self, m, lp, lora, adapter):
    return self._one("down", m, lp.w_down, None, lora, adapter)


STORED = StoredProjections()

_FIELDS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up",
           "down": "w_down"}


class StackedProjections(StoredProjections):
  """`STORED` for layer `i` (an int or a traced index) of the stacked `layers`: on CPU a decode
  step's products (one token a row) go to `cpu_matmul`'s kernel with the whole stack and the
  index, which reads the layer in place; a slice of the stack passed to a custom call would be
  copied first (Qwen2.5-Coder-1.5B: a layer's weights per token; 1.75 s a token at 1 row on XLA
  with slices, 0.14 s on the kernel). Elsewhere, and for longer passes, the slice, as `STORED`."""

  def __init__(self, layers: LayerParams, i):
    self.layers, self.i = layers, i

  def _one(self, target, h, w, bias, lora, adapter):
    stored = lambda h, w: StoredProjections._one(target, h, w, bias, lora, adapter)
    stack = getattr(self.layers, _FIELDS[target])
    if not cpu_matmul.takes(h, stack):
      return stored(h, w)

    def kernel(h, w):
      y = cpu_matmul.layer_kernel(h, stack, self.i)
      y = y if bias is None else y + bias
      y = y if lora is None or target not in lora else y + adapter.delta(h, lora[target])
      return y.astype(h.dtype)

    return jax.lax.platform_dependent(h, w, cpu=kernel, default=stored)


class LayerContext(NamedTuple):
  """What every layer of one pass shares."""

  cos: jax.Array  # [b, t, 1, x] RoPE tables
  sin: jax.Array
  visible: attention.Visibility  # which slots each query sees: positions, validity, segments
  config: LlmConfig
  adapter: Adapter | None
  project: Projections


def write_cache(buf, new, lead: tuple, start):
  """new [b, k, t, x] written at slot `start` of buf; (buf, what this layer's attention reads).

  lead: the indices before [b, k, s, x]: (layer,) into a stacked [l, b, k, s, x] cache, () into
  one layer's own buffer (the CPU decode loop's per-layer cache, updated in place)."""
  new = new.astype(buf.dtype).reshape((1,) * len(lead) + new.shape)
  buf = jax.lax.dynamic_update_slice(buf, new, (*lead, 0, 0, start, 0))
  return buf, buf[lead]


# Passes longer than this, and a multiple of it, run the MLP this many tokens at a time, each
# chunk recomputed in the backward pass: its [t, intermediate] activations and cotangents were
# the largest part of a long update's layer (8192 tokens, 2 layers, MLP 1024: a gradient's
# temporaries 407 -> 315 MiB), for one more MLP forward pass per chunk. Shorter passes (every
# prefill chunk, decode, MoRSE's updates up to 6144 slots) keep the one product.
MLP_CHUNK = 4096


def mlp(h, lp, lora, adapter, project):
  """down(silu(gate(h)) * up(h)): [b, t, d] -> [b, t, d], MLP_CHUNK tokens at a time where t is
  a longer multiple of it (rows are independent per token; adapters are per row)."""
  def one(h):
    gate, up = project.gate_up(h, lp, lora, adapter)
    return project.down(jax.nn.silu(gate) * up, lp, lora, adapter)

  b, t, d = h.shape
  if t <= MLP_CHUNK or t % MLP_CHUNK:
    return one(h)
  chunks = h.reshape(b, t // MLP_CHUNK, MLP_CHUNK, d).swapaxes(0, 1)
  out = jax.lax.map(jax.checkpoint(one), chunks)
  return out.swapaxes(0, 1).reshape(b, t, d)


def layer(x, lp, lora, ctx: LayerContext, kv):
  """One decoder layer; (x, kv).

  lp: this layer's weights, read through `ctx.project` (`LayerParams` sliced from the stack for
    `STORED`). lora: None or this layer's {target: adapter weights} (`Adapter.for_layer`; all
    zeros on non-adapted layers under scan).
  kv: None (no cache) or (k_buf, v_buf, lead, start): the layer's new k and v are written at slot
    `start` of k_buf / v_buf at leading indices `lead` (`write_cache`); returned as (k_buf, v_buf).
  """
  cos, sin, visible, config, adapter, project = ctx
  b, t, _ = x.shape
  h = rms_norm(x, lp.attn_norm, config.rms_norm_eps)
  q, k, v = project.qkv(h, lp, lora, adapter, config)
  q = q.reshape(b, t, config.num_heads, config.head_dim)
  k = k.reshape(b, t, config.num_kv_heads, config.head_dim)
  v = v.reshape(b, t, config.num_kv_heads, config.head_dim)
  if config.qk_norm:
    q = rms_norm(q, lp.q_norm, config.rms_norm_eps)
    k = rms_norm(k, lp.k_norm, config.rms_norm_eps)
  q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, k, t, x]
  if kv is not None:
    k_buf, v_buf, lead, start = kv
    k_buf, k = write_cache(k_buf, k, lead, start)
    v_buf, v = write_cache(v_buf, v, lead, start)
    kv = (k_buf, v_buf)
  x = x + project.o(_attention(q, k, v, visible, config), lp, lora, adapter)
  h = rms_norm(x, lp.mlp_norm, config.rms_norm_eps)
  x = x + mlp(h, lp, lora, adapter, project)
  return x, kv


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class WeightBits:
  """The embedding and stacked layers' 16-bit float weights viewed as uint16 (`bits_view`): the
  same buffers as the Params they come from, read where `forward` slices or gathers weights.

  XLA:CPU runs slices and gathers of 16-bit floats in float32, and hoists the conversion of an
  array that does not change in a loop out of it: slicing the stacked bf16 weights in the layer
  scan of a decode loop made a float32 copy of every weight (twice the bf16 weights; an
  optimization_barrier does not stop it). Sliced and gathered as integers, the weights reach
  their matmuls as bf16, which XLA:CPU multiplies (f32 accumulation) without converting them.
  The view is made outside jit: inside, a bitcast of a weight is materialised as a copy."""

  embed: jax.Array  # [v, d] uint16
  layers: LayerParams  # uint16 where the weight is a 16-bit float, else the weight itself


def bits_view(params: Params) -> WeightBits | None:
  """`WeightBits` sharing params' host buffers (zero-copy), for 16-bit weights on one CPU
  device; None elsewhere (accelerators slice 16-bit floats as they are)."""
  on_one_host_device = lambda a: (isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                                  and len(a.sharding.device_set) == 1)
  if not _is_16_bit(params.embed) or jax.default_backend() != "cpu" or not all(
      on_one_host_device(a) for a in jax.tree.leaves(params)):
    return None
  view = lambda a: jax.device_put(np.asarray(a).view(np.uint16)) if _is_16_bit(a) else a
  return WeightBits(embed=view(params.embed), layers=jax.tree.map(view, params.layers))


def _is_16_bit(a) -> bool:
  return a.dtype.itemsize == 2 and jnp.issubdtype(a.dtype, jnp.floating)


def _from_bits(tree, like):
  """A slice or gather of `WeightBits` back to the float dtypes of `like` (the same structure)."""
  return jax.tree.map(lambda a, ref: a if a.dtype == ref.dtype
                      else jax.lax.bitcast_convert_type(a, ref.dtype), tree, like)


def _run_layers(x, layers: LayerParams, ctx: LayerContext, kv, start, remat=False, bits=None):
  """`lax.scan` of `layer` over the stacked layers. bits: their `WeightBits.layers`, scanned
  over instead where given (decoding on CPU). remat: a cache-free scan recomputes each layer in
  the backward pass (see `forward`)."""
  config, adapter = ctx.config, ctx.adapter
  lora = None if adapter is None else adapter.stacked_over(config.num_layers)
  if kv is None:
    body = lambda x, xs: layer(x, xs[0], xs[1], ctx, None)
    x, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, (layers, lora))
    return x, None

  def body(carry, xs):
    x, k_all, v_all = carry
    lp, lora_layer, i = xs
    if bits is not None:
      lp = _from_bits(lp, layers)
    # Decoding: the kernel reads layer i of the whole stack (no per-step copy of a slice).
    at = ctx._replace(project=StackedProjections(layers, i)) if ctx.project is STORED else ctx
    x, (k_all, v_all) = layer(x, lp, lora_layer, at, (k_all, v_all, (i,), start))
    return (x, k_all, v_all), None

  xs = (layers if bits is None else bits, lora, jnp.arange(config.num_layers))
  (x, k_all, v_all), _ = jax.lax.scan(body, (x, *kv), xs)
  return x, (k_all, v_all)


def head_of(params: Params) -> jax.Array:
  """The output head [v, d]: lm_head, or the embedding where the two are tied."""
  return params.embed if params.lm_head is None else params.lm_head


def head_logits(x, head):
  """x [b, t, d] times head [v, d]: [b, t, v] float32. One token per row (decoding, `last_only`):
  on CPU `cpu_matmul`'s kernel (few rows); elsewhere head @ x^T with the small result
  transposed: with the head as the right operand XLA:CPU kept a transposed copy of the whole head
  for its matmul (0.47 GB for Qwen2.5's 151936 x 1536 bf16 head, hoisted out of the decode loop).
  Longer passes keep the plain product, whose [b, t, v] result would be the larger copy."""
  if x.shape[1] != 1:
    return jnp.einsum("btd,vd->btv", x, head, preferred_element_type=jnp.float32)

  def head_first(x, head):
    y = jax.lax.dot_general(head, x[:, 0], (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)  # [v, b]
    return y.T[:, None, :]

  if not cpu_matmul.takes(x, head):
    return head_first(x, head)
  return jax.lax.platform_dependent(x, head, cpu=cpu_matmul.kernel, default=head_first)


def default_positions(attention_mask, cache: KVCache | None):
  """Per-row positions that skip left padding, continuing from the cache when there is one."""
  base = 0 if cache is None else cache.next_pos[:, None]
  return base + jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


LayerRunner = Callable[..., tuple]  # (x, layers, ctx, kv, start) -> (x, kv)


@functools.partial(jax.jit, static_argnames=("config", "last_only", "remat", "run_layers",
                                             "hidden_only"))
def forward(params: Params, config: LlmConfig, tokens, positions=None, attention_mask=None,
            cache: KVCache | None = None, *, last_only: bool = False,
            adapter: Adapter | None = None, segments=None, remat: bool = False,
            run_layers: LayerRunner | None = None, bits: WeightBits | None = None,
            hidden_only: bool = False, embeds=None):
  """Runs the decoder.

  Args:
    tokens: [b, t] int token ids.
    positions: [b, t] RoPE positions; by default derived from `attention_mask` (and the cache).
      With `config.mrope_section` (Qwen2.5-VL) also [3, b, t]: the t / h / w streams
      (`vl.rope_index`); a cache then continues each row after its largest position.
    attention_mask: [b, t], 1 for real tokens, 0 for padding (left padding); default all ones.
    cache: a KVCache; the t tokens are written at slots [cache.length, cache.length + t).
      Refused (ValueError) where t exceeds the cache's slots, or, without a cache, the model's
      max_position_embeddings.
    last_only: return logits for the last slot only ([b, 1, v]), as prefill needs.
    adapter: per-row adapters (`Adapter`, e.g. morse_jax.lora's experts and routes); None for the
      bare backbone.
    segments: [b, t] int, no cache: several sequences in one row that share a prefix. Segment 0
      (the prefix) is seen by every later token; a token of segment k >= 1 sees only segment 0
      and earlier tokens of segment k (rl.shared_prefix). None: one sequence per row.
    remat: without a cache, keep only each layer's input for the backward pass and recompute
      the rest (`jax.checkpoint` per layer): a gradient then holds one layer's activations at a
      time instead of every layer's, for one more forward pass (attention itself keeps only
      q, k, v, its output and log-sum-exp: `attention.py`).
    run_layers: what runs `params.layers` over x and the cache; None: `lax.scan` over the stored
      stacked `LayerParams`. `fused_decode.run_layers` (the CPU decode loop) takes its own
      per-layer layout in params.layers and a per-layer cache (`fused_decode.decode_layout`).
    bits: `bits_view(params)`, with a cache: the embedding is gathered and the layers are scanned
      as their uint16 bits (no float32 copy of the weights on XLA:CPU).
    hidden_only: return the final-normed hidden states [b, t, d] instead of the logits, for a
      caller that multiplies by the head a chunk of tokens at a time (`head_of`,
      `rl.logprobs`: an update's [b, t, v] logits would be its largest activation).
    embeds: [b, t, d] input embeddings used instead of looking `tokens` up (`vl.forward`: the
      image tokens' rows replaced by the vision tower's outputs); tokens then only give shapes.

  Returns:
    (logits [b, t, v] float32 (or hidden states), updated cache or None).
  """
  b, t = tokens.shape
  mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
  if positions is None:
    positions = default_positions(mask, cache)
  cos, sin = _rope_tables(positions, config)
  if embeds is not None:
    x = embeds.astype(params.embed.dtype)
  elif bits is not None and cache is not None:
    x = _from_bits(jnp.take(bits.embed, tokens, axis=0), params.embed)
  else:
    x = jnp.take(params.embed, tokens, axis=0)
  if cache is None:
    if t > config.max_position_embeddings:
      raise ValueError(f"forward: {t} tokens are more than the model's max_position_embeddings "
                       f"({config.max_position_embeddings})")
    start = 0  # a Python int: the kernels see a cache-free causal pass
    valid = mask
  else:
    if segments is not None:
      raise ValueError("forward: segments are for cache-free passes (the update), not decoding")
    if t > cache.max_len:
      raise ValueError(f"forward: {t} tokens do not fit the cache's {cache.max_len} slots")
    start = cache.length
    valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, start))
  # Causal by slot: a chunk or a decode step reads only the slots up to its own end.
  visible = attention.Visibility(start, valid, segments)

  kv = None if cache is None else (cache.k, cache.v)
  ctx = LayerContext(cos, sin, visible, config, adapter, STORED)
  if run_layers is not None:
    x, kv = run_layers(x, params.layers, ctx, kv, start)
  else:
    x, kv = _run_layers(x, params.layers, ctx, kv, start, remat,
                        None if bits is None or kv is None else bits.layers)
  if last_only:
    x = x[:, -1:]
  x = rms_norm(x, params.final_norm, config.rms_norm_eps)
  logits = x if hidden_only else head_logits(x, head_of(params))
  if cache is not None:
    streams_max = positions if positions.ndim == 2 else jnp.max(positions, axis=0)
    last_real = jnp.max(jnp.where(mask, streams_max, -1), axis=1)
    cache = KVCache(k=kv[0], v=kv[1], valid=valid, length=cache.length + t,
                    next_pos=jnp.maximum(cache.next_pos, last_real + 1))
  return logits, cache
