"""What a generate call holds besides the weights and the cache, from the compiled program
(`memory_analysis`), and the weight layouts that keep it small: bf16 weights read through their
uint16 view (`model.bits_view`) and the fused CPU decode copy only where it is small."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import fused_decode
from morse_jax.llm import model as model_lib
from morse_jax.llm import sampling as sampling_lib
from tests import tiny_models

# Weights large against everything else a generate call holds: 4.7 MB of bf16 layers and a
# 1 MB untied head; the cache of 2 rows x 64 slots is 0.1 MB, the activations well under 1 MB.
WIDE = llm.LlmConfig("qwen2", vocab_size=2048, hidden_size=256, intermediate_size=1024,
                     num_layers=3, num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=True,
                     tie_word_embeddings=False)
ROWS, PROMPT, GEN = 2, 32, 32

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's conversions")


@pytest.fixture(scope="module")
def wide16():
  return llm.params.cast(llm.init_random(WIDE, jax.random.key(1), scale=0.1), jnp.bfloat16)


def _args(params):
  tokens = jnp.asarray(tiny_models.random_tokens(0, (ROWS, PROMPT)) % WIDE.vocab_size)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(ROWS))
  return (params, WIDE, tokens, jnp.ones_like(tokens), keys, jnp.int32(GEN))


def _temp_bytes(params, unstack: bool, bits=None) -> int:
  compiled = sampling_lib.generate_padded.lower(
      *_args(params), llm.GenerationSettings(GEN, llm.GREEDY, unstack=unstack),
      bits=bits).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def _weight_bytes(params) -> int:
  return sum(a.nbytes for a in jax.tree.leaves(params))


@cpu_only
def test_bits_view_shares_the_weights_buffers(wide16):
  bits = model_lib.bits_view(wide16)
  assert bits.embed.dtype == jnp.uint16
  assert bits.embed.unsafe_buffer_pointer() == wide16.embed.unsafe_buffer_pointer()
  assert bits.layers.w_up.unsafe_buffer_pointer() == wide16.layers.w_up.unsafe_buffer_pointer()
  np.testing.assert_array_equal(
      np.asarray(bits.layers.wq), np.asarray(wide16.layers.wq).view(np.uint16))
  assert model_lib.bits_view(llm.params.cast(wide16, jnp.float32)) is None


@cpu_only
def test_scanned_bfloat16_decode_makes_no_copy_of_the_weights(wide16):
  """Read through `bits_view`, the prefill and the scanned decode loop hold about a third of the
  bf16 weights besides them (one layer's slice, the activations); read as bf16, XLA:CPU hoists a float32 copy of the sliced weights
  out of the loops (more than the weights themselves)."""
  weights = _weight_bytes(wide16)
  with_bits = _temp_bytes(wide16, unstack=False, bits=model_lib.bits_view(wide16))
  without = _temp_bytes(wide16, unstack=False)
  assert with_bits < 0.35 * weights, f"{with_bits / 1e6:.2f} MB for {weights / 1e6:.2f} MB"
  assert without > 1.0 * weights, f"{without / 1e6:.2f} MB for {weights / 1e6:.2f} MB"


def test_bfloat16_decode_through_the_bits_equals_the_plain_one(wide16):
  """The same program reading the weights through their uint16 view: the same greedy tokens and
  log-probs, bit for bit."""
  settings = llm.GenerationSettings(GEN, llm.GREEDY, unstack=False)
  plain = sampling_lib.generate_padded(*_args(wide16), settings)
  bits = model_lib.bits_view(wide16)
  through = sampling_lib.generate_padded(*_args(wide16), settings, bits=bits)
  for a, b in zip(plain, through):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@cpu_only
def test_the_fused_decode_copy_is_the_default_only_where_it_is_small(wide16, monkeypatch):
  assert sampling_lib.default_unstack(wide16)
  layers = _weight_bytes(wide16.layers)
  monkeypatch.setattr(fused_decode, "MAX_COPY_BYTES", layers - 1)
  assert not sampling_lib.default_unstack(wide16)


QWEN = llm.LlmConfig("qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                     num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128, qkv_bias=True,
                     tie_word_embeddings=False)  # Qwen2.5-Coder-1.5B-Instruct's shapes


@pytest.mark.slow
@cpu_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_qwen_generate_compiles_within_one_and_a_half_weights_and_cache(dtype):
  """32 rows x 512-token prompts x 512 new tokens at Qwen2.5-Coder-1.5B's shapes, compiled from
  abstract arrays as `sample` runs it on CPU (the scan, through `bits_view` for bf16): the
  weights and every temporary (the cache is one: it is made inside) within 1.5x weights +
  cache. Measured: bf16 3.55 GB + 1.76 GB temporaries for 3.55 + 0.94 GB (1.18x); f32 7.11 +
  3.97 GB for 7.11 + 1.88 GB (1.23x)."""
  rows, prompt, new = 32, 512, 512
  float_dtype = jnp.dtype(dtype)
  spec = lambda shape, d=float_dtype: jax.ShapeDtypeStruct(shape, d)
  params = jax.tree.map(spec, llm.param_shapes(QWEN), is_leaf=lambda s: isinstance(s, tuple))
  bits = None
  if float_dtype.itemsize == 2:
    as_u16 = lambda a: spec(a.shape, jnp.uint16) if a.dtype == float_dtype else a
    bits = model_lib.WeightBits(embed=as_u16(params.embed),
                                layers=jax.tree.map(as_u16, params.layers))
  tokens = spec((rows, prompt), jnp.int32)
  keys = jax.ShapeDtypeStruct((rows,), jax.random.key(0).dtype)
  unstack = sampling_lib.default_unstack(params)
  assert not unstack  # the fused copy would be 3.1 GB (bf16) / 6.2 GB (f32) of layers more
  compiled = sampling_lib.generate_padded.lower(
      params, QWEN, tokens, tokens, keys, spec((), jnp.int32),
      llm.GenerationSettings(new, llm.GREEDY, unstack=unstack), bits=bits).compile()
  weights = sum(np.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(params))
  cache = 2 * QWEN.num_layers * rows * QWEN.num_kv_heads * (prompt + new) * QWEN.head_dim
  cache *= float_dtype.itemsize
  held = weights + compiled.memory_analysis().temp_size_in_bytes  # bits: the same buffers
  assert held < 1.5 * (weights + cache), f"{held / 1e9:.2f} GB for {(weights + cache) / 1e9:.2f}"
