"""Each backbone tensor is declared once (llm.params.WEIGHTS): shapes, logical axes, initial
values and checkpoint names all come from it."""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import params as params_lib
from morse_jax.llm import sharding
from morse_jax.llm.config import FAMILIES

# d 64, h 8 x 16 = 128, k 4 x 16 = 64, f 96, v 50, l 3
CONFIG = llm.LlmConfig("qwen3", vocab_size=50, hidden_size=64, intermediate_size=96, num_layers=3,
                       num_heads=8, num_kv_heads=4, head_dim=16, qk_norm=True, qkv_bias=True,
                       tie_word_embeddings=False)


def test_shapes_follow_the_axis_sizes():
  shapes = llm.param_shapes(CONFIG)
  assert shapes.embed == (50, 64) and shapes.lm_head == (50, 64) and shapes.final_norm == (64,)
  lp = shapes.layers
  assert (lp.wq, lp.wk, lp.wv, lp.wo) == ((3, 128, 64), (3, 64, 64), (3, 64, 64), (3, 64, 128))
  assert (lp.w_gate, lp.w_up, lp.w_down) == ((3, 96, 64), (3, 96, 64), (3, 64, 96))
  assert (lp.bq, lp.bk, lp.bv, lp.q_norm, lp.attn_norm) == ((3, 128), (3, 64), (3, 64), (3, 16),
                                                            (3, 64))
  assert lp.bo is None  # o_bias off
  tied = llm.LlmConfig("llama", vocab_size=50, hidden_size=64, intermediate_size=96,
                       num_layers=3, num_heads=8, num_kv_heads=4, head_dim=16,
                       tie_word_embeddings=True)
  shapes = llm.param_shapes(tied)
  assert shapes.lm_head is None and shapes.layers.bq is None and shapes.layers.q_norm is None
  assert CONFIG.num_params() == sum(int(np.prod(s)) for s in jax.tree.leaves(
      llm.param_shapes(CONFIG), is_leaf=lambda s: isinstance(s, tuple)))


def test_abstract_params_and_axes_match_the_declarations():
  abstract = params_lib.abstract_params(CONFIG, jnp.bfloat16)
  assert abstract.layers.wq.shape == (3, 128, 64) and abstract.layers.wq.dtype == jnp.bfloat16
  assert abstract.layers.bo is None
  assert sharding.PARAM_AXES.layers.wo == ("layers", "embed", "heads")
  assert sharding.PARAM_AXES.embed == ("vocab", "embed")
  for w in jax.tree.leaves(params_lib.WEIGHTS):
    assert all(axis in sharding.LOGICAL_AXES for axis in w.axes), w


def test_init_random_by_declared_initialiser():
  p = llm.init_random(CONFIG, jax.random.key(0), scale=0.5, norm_jitter=0.0)
  np.testing.assert_array_equal(np.asarray(p.layers.q_norm), np.ones((3, 16)))
  np.testing.assert_array_equal(np.asarray(p.final_norm), np.ones(64))
  # one key per tensor in the Params order: embed is the first
  key = jax.random.split(jax.random.key(0), len(jax.tree.leaves(p)))[0]
  np.testing.assert_allclose(np.asarray(p.embed),
                             0.5 * np.asarray(jax.random.normal(key, (50, 64))), rtol=1e-6)
  jittered = llm.init_random(CONFIG, jax.random.key(0), norm_jitter=0.1)
  assert 0.0 < float(jnp.abs(jittered.layers.attn_norm - 1.0).max()) < 1.0
  with pytest.raises(ValueError, match="Weight.init 'zeros' not in"):
    params_lib.Weight(("embed",), "zeros", "a", "b")


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_names_are_ggufs_own(family):
  """The declared GGUF names are what gguf's tensor-name map (the one transformers uses) gives
  for the declared Hugging Face names."""
  arch = {name: arch_id for arch_id, name in gguf.MODEL_ARCH_NAMES.items()}[family]
  names = gguf.get_tensor_name_map(arch, CONFIG.num_layers)
  for w in jax.tree.leaves(params_lib.WEIGHTS):
    for layer in (range(CONFIG.num_layers) if w.stacked else [None]):
      module, suffix = w.hf.format(i=layer).rsplit(".", 1)
      if family != "qwen3" and w.hf.endswith(("q_norm.weight", "k_norm.weight")):
        continue  # Qwen3 only
      assert f"{names.get_name(module)}.{suffix}" == w.gguf.format(i=layer), (family, w.hf)
