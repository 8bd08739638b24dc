"""Backbone weights as pytrees of registered dataclasses, per-layer tensors stacked on axis 0.

Projection weights are stored [out, in], as torch.nn.Linear and PEFT store them: loading needs no
transpose, and checkpoints, sharding rules and adapters all speak this layout. The CPU decode loop
runs on `FusedLayer` copies instead ([in, out], q/k/v and gate/up fused), made once per generate
call: XLA:CPU reads an [in, out] weight at batch 8 faster than an [out, in] one contracted on its
last axis, and one fused matmul replaces three (benchmarks/decode_step.py measures the step).
Dimension letters used across the package: b batch, t query tokens, s key slots, d hidden,
h query heads, k kv heads, g heads per kv head, x head_dim, f mlp, v vocab, l layers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from morse_jax.llm.config import LlmConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerParams:
  attn_norm: jax.Array  # [l, d]
  wq: jax.Array  # [l, h*x, d]
  wk: jax.Array  # [l, k*x, d]
  wv: jax.Array  # [l, k*x, d]
  wo: jax.Array  # [l, d, h*x]
  mlp_norm: jax.Array  # [l, d]
  w_gate: jax.Array  # [l, f, d]
  w_up: jax.Array  # [l, f, d]
  w_down: jax.Array  # [l, d, f]
  bq: jax.Array | None = None  # [l, h*x]
  bk: jax.Array | None = None  # [l, k*x]
  bv: jax.Array | None = None  # [l, k*x]
  bo: jax.Array | None = None  # [l, d]
  q_norm: jax.Array | None = None  # [l, x]
  k_norm: jax.Array | None = None  # [l, x]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
  embed: jax.Array  # [v, d]
  layers: LayerParams
  final_norm: jax.Array  # [d]
  lm_head: jax.Array | None = None  # [v, d]; None when tied to embed


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FusedLayer:
  """One layer's weights as the CPU decode loop reads them (`fuse_layer`); no layer axis."""

  attn_norm: jax.Array  # [d]
  wqkv: jax.Array  # [d, h*x + 2*k*x]: q, k, v side by side, [in, out]
  wo: jax.Array  # [h*x, d]
  mlp_norm: jax.Array  # [d]
  w_gate_up: jax.Array  # [d, 2*f]: gate, up
  w_down: jax.Array  # [f, d]
  bqkv: jax.Array | None = None  # [h*x + 2*k*x]
  bo: jax.Array | None = None  # [d]
  q_norm: jax.Array | None = None  # [x]
  k_norm: jax.Array | None = None  # [x]


def fuse_layer(lp: LayerParams) -> FusedLayer:
  """One (unstacked) layer's [out, in] weights as a FusedLayer (a copy)."""
  cat = lambda *ws: jnp.concatenate([w.T for w in ws], axis=1)
  bias = None if lp.bq is None else jnp.concatenate([lp.bq, lp.bk, lp.bv])
  return FusedLayer(attn_norm=lp.attn_norm, wqkv=cat(lp.wq, lp.wk, lp.wv), wo=lp.wo.T,
                    mlp_norm=lp.mlp_norm, w_gate_up=cat(lp.w_gate, lp.w_up), w_down=lp.w_down.T,
                    bqkv=bias, bo=lp.bo, q_norm=lp.q_norm, k_norm=lp.k_norm)


def param_shapes(config: LlmConfig) -> Params:
  """The expected shape of every tensor, as a Params of tuples (None where absent)."""
  c, layers = config, config.num_layers
  opt = lambda flag, shape: shape if flag else None
  return Params(
      embed=(c.vocab_size, c.hidden_size),
      layers=LayerParams(
          attn_norm=(layers, c.hidden_size),
          wq=(layers, c.q_size, c.hidden_size),
          wk=(layers, c.kv_size, c.hidden_size),
          wv=(layers, c.kv_size, c.hidden_size),
          wo=(layers, c.hidden_size, c.q_size),
          mlp_norm=(layers, c.hidden_size),
          w_gate=(layers, c.intermediate_size, c.hidden_size),
          w_up=(layers, c.intermediate_size, c.hidden_size),
          w_down=(layers, c.hidden_size, c.intermediate_size),
          bq=opt(c.qkv_bias, (layers, c.q_size)),
          bk=opt(c.qkv_bias, (layers, c.kv_size)),
          bv=opt(c.qkv_bias, (layers, c.kv_size)),
          bo=opt(c.o_bias, (layers, c.hidden_size)),
          q_norm=opt(c.qk_norm, (layers, c.head_dim)),
          k_norm=opt(c.qk_norm, (layers, c.head_dim)),
      ),
      final_norm=(c.hidden_size,),
      lm_head=opt(not c.tie_word_embeddings, (c.vocab_size, c.hidden_size)),
  )


def init_random(config: LlmConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02,
                norm_jitter: float = 0.0) -> Params:
  """Random weights (normal * scale; norms 1 + jitter*normal) for tests, demos and benchmarks."""
  shapes = param_shapes(config)
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda s: isinstance(s, tuple))
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda s: isinstance(s, tuple))[0]]
  keys = jax.random.split(key, len(leaves))
  out = []
  for path, shape, k in zip(paths, leaves, keys):
    noise = jax.random.normal(k, shape, jnp.float32)
    if "norm" in path:
      out.append((1.0 + norm_jitter * noise).astype(dtype))
    else:
      out.append((scale * noise).astype(dtype))
  return jax.tree.unflatten(treedef, out)


def cast(params: Params, dtype) -> Params:
  return jax.tree.map(lambda a: a.astype(dtype), params)
