"""Backbone weights as pytrees of registered dataclasses, per-layer tensors stacked on axis 0.

Each tensor is declared once, in `WEIGHTS`: a `Weight` names its logical axes, its initialiser
and its tensor names in Hugging Face and GGUF checkpoints; its shape (`axis_sizes`), its sharding
(`sharding.param_shardings`), the checkpoint mapping (`hf.assemble_params`, `hf.hf_tensors`,
`gguf.load`) and `init_random` are derived from it.

Projection weights are stored [out, in], as torch.nn.Linear and PEFT store them: loading needs no
transpose, and checkpoints, sharding rules and adapters all speak this layout (the CPU decode
loop's own copies are `llm.fused_decode`'s).
Dimension letters used across the package: b batch, t query tokens, s key slots, d hidden,
h query heads, k kv heads, g heads per kv head, x head_dim, f mlp, v vocab, l layers.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from morse_jax.llm.config import LlmConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerParams:
  """Per-layer tensors, each stacked over the layers on axis 0; shapes and names in `WEIGHTS`."""

  attn_norm: jax.Array
  wq: jax.Array
  wk: jax.Array
  wv: jax.Array
  wo: jax.Array
  mlp_norm: jax.Array
  w_gate: jax.Array
  w_up: jax.Array
  w_down: jax.Array
  bq: jax.Array | None = None
  bk: jax.Array | None = None
  bv: jax.Array | None = None
  bo: jax.Array | None = None
  q_norm: jax.Array | None = None
  k_norm: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
  embed: jax.Array
  layers: LayerParams
  final_norm: jax.Array
  lm_head: jax.Array | None = None  # None when tied to embed


INITS = ("normal", "norm")  # scale * N(0, 1); 1 + jitter * N(0, 1) (see init_random)


@dataclasses.dataclass(frozen=True)
class Weight:
  """One backbone tensor's declaration.

  axes: logical axis names (sizes from `axis_sizes`; mesh axes from `sharding.ShardingRules`).
  hf, gguf: its tensor names in a Hugging Face / GGUF checkpoint, "{i}" the layer of a stacked
    tensor; both [out, in] as stored here.
  gguf_heads: the LlmConfig field whose head count llama.cpp's converter interleaves the rows of
    (Llama's q / k projections; `gguf.load` undoes it).
  present: for an optional tensor, whether a config has it.
  """

  axes: tuple[str, ...]
  init: str
  hf: str
  gguf: str
  gguf_heads: str | None = None
  present: Callable[[LlmConfig], bool] | None = None

  def __post_init__(self):
    if self.init not in INITS:
      raise ValueError(f"Weight.init {self.init!r} not in {INITS}")

  @property
  def stacked(self) -> bool:
    return self.axes[0] == "layers"

  def shape(self, config: LlmConfig) -> tuple[int, ...]:
    sizes = axis_sizes(config)
    return tuple(sizes[axis] for axis in self.axes)


def axis_sizes(config: LlmConfig) -> dict[str, int]:
  """Size of each logical axis in a weight; head axes are head-major rows (heads * head_dim)."""
  c = config
  return {"layers": c.num_layers, "embed": c.hidden_size, "heads": c.q_size,
          "kv_heads": c.kv_size, "head_dim": c.head_dim, "mlp": c.intermediate_size,
          "vocab": c.vocab_size}


def _layer(axes, init, hf, gguf, **kw):
  """A per-layer tensor: the layer axis in front, names under model.layers.{i} / blk.{i}."""
  return Weight(("layers",) + axes, init, f"model.layers.{{i}}.{hf}", f"blk.{{i}}.{gguf}", **kw)


_QKV_BIAS = lambda c: c.qkv_bias
_O_BIAS = lambda c: c.o_bias
_QK_NORM = lambda c: c.qk_norm

WEIGHTS = Params(
    embed=Weight(("vocab", "embed"), "normal", "model.embed_tokens.weight", "token_embd.weight"),
    layers=LayerParams(
        attn_norm=_layer(("embed",), "norm", "input_layernorm.weight", "attn_norm.weight"),
        wq=_layer(("heads", "embed"), "normal", "self_attn.q_proj.weight", "attn_q.weight",
                  gguf_heads="num_heads"),
        wk=_layer(("kv_heads", "embed"), "normal", "self_attn.k_proj.weight", "attn_k.weight",
                  gguf_heads="num_kv_heads"),
        wv=_layer(("kv_heads", "embed"), "normal", "self_attn.v_proj.weight", "attn_v.weight"),
        wo=_layer(("embed", "heads"), "normal", "self_attn.o_proj.weight", "attn_output.weight"),
        mlp_norm=_layer(("embed",), "norm", "post_attention_layernorm.weight", "ffn_norm.weight"),
        w_gate=_layer(("mlp", "embed"), "normal", "mlp.gate_proj.weight", "ffn_gate.weight"),
        w_up=_layer(("mlp", "embed"), "normal", "mlp.up_proj.weight", "ffn_up.weight"),
        w_down=_layer(("embed", "mlp"), "normal", "mlp.down_proj.weight", "ffn_down.weight"),
        bq=_layer(("heads",), "normal", "self_attn.q_proj.bias", "attn_q.bias",
                  gguf_heads="num_heads", present=_QKV_BIAS),
        bk=_layer(("kv_heads",), "normal", "self_attn.k_proj.bias", "attn_k.bias",
                  gguf_heads="num_kv_heads", present=_QKV_BIAS),
        bv=_layer(("kv_heads",), "normal", "self_attn.v_proj.bias", "attn_v.bias",
                  present=_QKV_BIAS),
        bo=_layer(("embed",), "normal", "self_attn.o_proj.bias", "attn_output.bias",
                  present=_O_BIAS),
        q_norm=_layer(("head_dim",), "norm", "self_attn.q_norm.weight", "attn_q_norm.weight",
                      present=_QK_NORM),
        k_norm=_layer(("head_dim",), "norm", "self_attn.k_norm.weight", "attn_k_norm.weight",
                      present=_QK_NORM),
    ),
    final_norm=Weight(("embed",), "norm", "model.norm.weight", "output_norm.weight"),
    lm_head=Weight(("vocab", "embed"), "normal", "lm_head.weight", "output.weight",
                   present=lambda c: not c.tie_word_embeddings),
)


def declared(config: LlmConfig) -> Params:
  """`WEIGHTS` with the tensors `config` does not have set to None."""
  return jax.tree.map(lambda w: w if w.present is None or w.present(config) else None, WEIGHTS)


def param_shapes(config: LlmConfig) -> Params:
  """The shape of every tensor, as a Params of tuples (None where absent)."""
  return jax.tree.map(lambda w: w.shape(config), declared(config))


def abstract_params(config: LlmConfig, dtype=jnp.bfloat16) -> Params:
  """Params of `jax.ShapeDtypeStruct`s (None where absent): the weights without allocating them."""
  return jax.tree.map(lambda w: jax.ShapeDtypeStruct(w.shape(config), dtype), declared(config))


def init_random(config: LlmConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02,
                norm_jitter: float = 0.0) -> Params:
  """Random weights by each Weight's init ("normal": scale * N(0, 1), "norm":
  1 + norm_jitter * N(0, 1)), one key per tensor in the Params order; for tests, demos and
  benchmarks."""
  weights = declared(config)
  leaves, treedef = jax.tree.flatten(weights)
  out = []
  for w, k in zip(leaves, jax.random.split(key, len(leaves))):
    noise = jax.random.normal(k, w.shape(config), jnp.float32)
    value = 1.0 + norm_jitter * noise if w.init == "norm" else scale * noise
    out.append(value.astype(dtype))
  return jax.tree.unflatten(treedef, out)


def cast(params: Params, dtype) -> Params:
  return jax.tree.map(lambda a: a.astype(dtype), params)
