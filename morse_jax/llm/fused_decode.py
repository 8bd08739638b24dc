"""The CPU decode loop's weight layout: per-layer copies of the stored weights with q / k / v and
gate / up fused (rows side by side, [out, in] as stored), run by a Python loop over the layers,
each writing its own cache.

`sampling.generate_padded` chooses it once per call (`decode_layout`, then `forward(...,
run_layers=run_layers)` for every decode step) and the engine once for its life; `model.forward`
itself only scans the stored layers. Why it is faster on XLA:CPU: every slice of a stacked weight
inside a jitted loop is materialised as a copy (measured: 30% of a 100M model's decode step), so
unstacking once pays that once instead of once per token; one fused product replaces three; and
each product of few rows goes to `cpu_matmul`'s kernel, which reads [out, in] rows as they lie
(`benchmarks/decode_step.py` measures the step). The cost: one copy of the layer weights, which
`fits` bounds.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from morse_jax.llm import cpu_matmul, model
from morse_jax.llm.model import KVCache, LayerContext
from morse_jax.llm.params import LayerParams, Params

# The largest layer weights copied into this layout by default (`fits`): a generate call holds
# the stored weights plus this copy, so above it the decode loop scans the stored weights instead
# (no copy; Qwen2.5-Coder-1.5B's 3.1 GB of bf16 layers would double the resident weights).
MAX_COPY_BYTES = 1 << 30


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FusedLayer:
  """One layer's weights as the CPU decode loop reads them (`fuse_layer`); no layer axis."""

  attn_norm: jax.Array  # [d]
  wqkv: jax.Array  # [h*x + 2*k*x, d]: q, k, v rows one after another, [out, in]
  wo: jax.Array  # [d, h*x]
  mlp_norm: jax.Array  # [d]
  w_gate_up: jax.Array  # [2*f, d]: gate, up
  w_down: jax.Array  # [d, f]
  bqkv: jax.Array | None = None  # [h*x + 2*k*x]
  bo: jax.Array | None = None  # [d]
  q_norm: jax.Array | None = None  # [x]
  k_norm: jax.Array | None = None  # [x]


def fuse_layer(lp: LayerParams) -> FusedLayer:
  """One (unstacked) layer's [out, in] weights as a FusedLayer (a copy)."""
  cat = lambda *ws: jnp.concatenate(ws, axis=0)
  bias = None if lp.bq is None else jnp.concatenate([lp.bq, lp.bk, lp.bv])
  return FusedLayer(attn_norm=lp.attn_norm, wqkv=cat(lp.wq, lp.wk, lp.wv), wo=lp.wo,
                    mlp_norm=lp.mlp_norm, w_gate_up=cat(lp.w_gate, lp.w_up), w_down=lp.w_down,
                    bqkv=bias, bo=lp.bo, q_norm=lp.q_norm, k_norm=lp.k_norm)


def decode_layers(layers: LayerParams) -> tuple[FusedLayer, ...]:
  """Stacked layers as per-layer FusedLayer copies."""
  n = jax.tree.leaves(layers)[0].shape[0]
  return tuple(fuse_layer(jax.tree.map(lambda a, i=i: a[i], layers)) for i in range(n))


def unstack_cache(cache: KVCache) -> KVCache:
  """k and v as tuples of per-layer [b, k, s, x] arrays: each layer then updates and reads its
  own buffer in place, where slicing one stacked array in an unrolled layer loop copies a
  layer's slots (and the update may copy the whole cache) per step on XLA:CPU."""
  split = lambda a: tuple(a[i] for i in range(a.shape[0]))
  return dataclasses.replace(cache, k=split(cache.k), v=split(cache.v))


def decode_layout(params: Params, cache: KVCache) -> tuple[Params, KVCache]:
  """params with `decode_layers`' copies and the cache split per layer: what `run_layers` reads."""
  return dataclasses.replace(params, layers=decode_layers(params.layers)), unstack_cache(cache)


def fits(params: Params) -> bool:
  """Whether the default CPU decode uses this layout: the layers' copy is at most MAX_COPY_BYTES."""
  layers = jax.tree.leaves(params.layers)  # arrays or ShapeDtypeStructs
  return sum(math.prod(a.shape) * a.dtype.itemsize for a in layers) <= MAX_COPY_BYTES


def _plus_delta(y, target: str, h, lora, adapter):
  """y (one target's slice of a fused f32 product) plus the target's adapter delta, if any."""
  return y if lora is None or target not in lora else y + adapter.delta(h, lora[target])


def _matmul(h, w, bias=None):
  y = cpu_matmul.matmul(h, w)  # w [out, in]; float32
  return y if bias is None else y + bias


class FusedProjections:
  """`model.Projections` of a FusedLayer: one matmul for q / k / v and one for gate / up, each
  target's adapter delta added to its slice."""

  def qkv(self, h, lp, lora, adapter, config):
    y = _matmul(h, lp.wqkv, lp.bqkv)
    q_end, k_end = config.q_size, config.q_size + config.kv_size
    parts = (y[..., :q_end], y[..., q_end:k_end], y[..., k_end:])
    return tuple(_plus_delta(part, target, h, lora, adapter).astype(h.dtype)
                 for part, target in zip(parts, ("q", "k", "v")))

  def o(self, a, lp, lora, adapter):
    return _plus_delta(_matmul(a, lp.wo, lp.bo), "o", a, lora, adapter).astype(a.dtype)

  def gate_up(self, h, lp, lora, adapter):
    parts = jnp.split(_matmul(h, lp.w_gate_up), 2, axis=-1)
    return tuple(_plus_delta(part, target, h, lora, adapter).astype(h.dtype)
                 for part, target in zip(parts, ("gate", "up")))

  def down(self, m, lp, lora, adapter):
    return _plus_delta(_matmul(m, lp.w_down), "down", m, lora, adapter).astype(m.dtype)


FUSED = FusedProjections()


def run_layers(x, layers: tuple[FusedLayer, ...], ctx: LayerContext, kv, start):
  """`model.forward`'s `run_layers` for `decode_layout`: `model.layer` over each FusedLayer in a
  Python loop, each writing its own [b, k, s, x] cache buffers."""
  if kv is None or not isinstance(kv[0], tuple):
    raise ValueError("fused_decode.run_layers: needs the per-layer cache of `decode_layout`")
  ctx = ctx._replace(project=FUSED)
  ks, vs = [], []
  for i, lp in enumerate(layers):
    lora = None if ctx.adapter is None else ctx.adapter.for_layer(i)
    x, (k, v) = model.layer(x, lp, lora, ctx, (kv[0][i], kv[1][i], (), start))
    ks.append(k)
    vs.append(v)
  return x, (tuple(ks), tuple(vs))
