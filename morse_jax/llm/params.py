"""Backbone weights as pytrees of registered dataclasses, per-layer tensors stacked on axis 0.

Projection weights are stored [out, in], as torch.nn.Linear and PEFT store them: loading needs no
transpose, and checkpoints, sharding rules and adapters all speak this layout (the CPU decode
loop's own copies are `llm.fused_decode`'s).
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
