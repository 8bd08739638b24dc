"""`llm.attention`: the blocked attention equals the dense formula (kept here only as the oracle)
in values and gradients, never holds a [t, s] score matrix, and the accelerator exports carry
their kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import attention
from morse_jax.llm import attention_kernels
from tests import tiny_models

F32_TOL = 1e-5
BF16_TOL = 2e-2  # bf16 operands (8 mantissa bits), outputs rounded to bf16: ~2^-7 relative


def dense(q, k, v, vis: attention.Visibility):
  """The textbook formula with a [b, t, s] mask, in float32: the oracle. Rows that see no key
  give zeros, as the blocked path defines them."""
  b, t, h, x = q.shape
  kv, s = k.shape[1], k.shape[2]
  q_slot = vis.q_start + jnp.arange(t)
  k_slot = jnp.arange(s)
  mask = vis.k_valid[:, None, :] & (k_slot[None, None, :] <= q_slot[None, :, None])
  if vis.segments is not None:
    seg = vis.segments
    mask &= (seg[:, None, :] == 0) | (seg[:, :, None] == seg[:, None, :])
  qg = q.reshape(b, t, kv, h // kv, x).astype(jnp.float32)
  scores = jnp.einsum("btkgx,bksx->bkgts", qg, k.astype(jnp.float32)) * x ** -0.5
  sees = mask[:, None, None]
  probs = jax.nn.softmax(jnp.where(sees, scores, -1e30), axis=-1)
  probs = jnp.where(sees.any(-1, keepdims=True), probs, 0.0)
  return jnp.einsum("bkgts,bksx->btkgx", probs, v.astype(jnp.float32)).reshape(b, t, h, x)


def _inputs(seed, b, t, h, kv, s, x=8, dtype=jnp.float32):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(b, t, h, x), dtype)
  k = jnp.asarray(rng.randn(b, kv, s, x), dtype)
  v = jnp.asarray(rng.randn(b, kv, s, x), dtype)
  w = jnp.asarray(rng.randn(b, t, h, x), jnp.float32)  # a random cotangent
  return q, k, v, w


def _check(q, k, v, w, vis, blocks, tol):
  """Output and d(sum(out * w))/d(q, k, v) of the blocked path against the oracle's."""
  ours = lambda q, k, v: attention.attention(q, k, v, vis, blocks)
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w)
  f32 = lambda a: a.astype(jnp.float32)
  np.testing.assert_allclose(np.asarray(f32(ours(q, k, v))), np.asarray(dense(q, k, v, vis)),
                             atol=tol, rtol=tol)
  got = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(lambda q, k, v: dense(f32(q), f32(k), f32(v), vis)),
                  argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", got, want):
    scale = max(1.0, float(jnp.max(jnp.abs(b))))
    np.testing.assert_allclose(np.asarray(f32(a)), np.asarray(b), atol=tol * scale, rtol=tol,
                               err_msg=f"d{name}")


# (kv heads of 4 query heads, blocks (q, k), dtype): 4, 2 and 1 groups; blocks dividing 32 and
# not dividing 37
CASES = [(4, (8, 8), jnp.float32), (2, (8, 16), jnp.float32), (1, (16, 8), jnp.float32),
         (2, (5, 7), jnp.float32), (2, (8, 16), jnp.bfloat16)]


# every case at 37 tokens (no block divides it) and the first at 32; the other cases at 32 only
# in the slow run (about 5 s each)
PADDED = [(*c, 37) for c in CASES] + [(*CASES[0], 32)] + [
    pytest.param(*c, 32, marks=pytest.mark.slow) for c in CASES[1:]]


@pytest.mark.parametrize("kv,blocks,dtype,t", PADDED)
def test_left_padded_update_matches_dense(kv, blocks, dtype, t):
  q, k, v, w = _inputs(0, 2, t, 4, kv, t, dtype=dtype)
  valid = np.ones((2, t), bool)
  valid[0, :6] = False  # left padding: rows 0..5 of row 0 see nothing
  vis = attention.Visibility(0, jnp.asarray(valid))
  _check(q, k, v, w, vis, attention.Blocks(*blocks), F32_TOL if dtype == jnp.float32 else BF16_TOL)


def test_block_size_divides_when_it_can():
  """Blocks divide the rows when a divisor between block / 2 and block exists (no padded block);
  a prime length keeps the block (the cases above at t = 37 run the padded path)."""
  assert [attention.block_size(n, 256) for n in (100, 256, 384, 768, 1000, 1024, 257)] == [
      100, 256, 192, 256, 250, 256, 256]
  assert attention.block_size(37, 8) == 8 and attention.block_size(32, 5) == 4


@pytest.mark.parametrize("kv,blocks", [(2, (8, 8)), (1, (5, 7))])
def test_shared_prefix_segments_match_dense(kv, blocks):
  t = 37
  q, k, v, w = _inputs(1, 2, t, 4, kv, t)
  seg = np.zeros((2, t), np.int32)
  seg[:, 12:20], seg[:, 20:33], seg[1, 33:] = 1, 2, 3
  valid = np.ones((2, t), bool)
  valid[0, 33:] = False  # right padding after the last segment
  vis = attention.Visibility(0, jnp.asarray(valid), jnp.asarray(seg))
  _check(q, k, v, w, vis, attention.Blocks(*blocks), F32_TOL)


@pytest.mark.parametrize("t,start", [(9, 13), (16, 34), (1, 30), (1, 49)])
def test_cache_with_holes_matches_dense(t, start):
  """A prefill chunk (t > 1) or decode step (t == 1) at a traced slot of a 50-slot cache whose
  valid mask has left padding and a hole in the middle."""
  s = 50
  q, k, v, w = _inputs(2, 2, t, 4, 2, s)
  valid = np.ones((2, s), bool)
  valid[0, :3], valid[1, 10:12] = False, False
  valid[:, start + t:] = False  # not written yet
  vis = attention.Visibility(jnp.int32(start), jnp.asarray(valid))
  _check(q, k, v, w, vis, attention.Blocks(8, 16, 16), F32_TOL)
  traced = jax.jit(lambda q, k, v, start: attention.attention(
      q, k, v, vis._replace(q_start=start), attention.Blocks(8, 16, 16)))(q, k, v, jnp.int32(start))
  np.testing.assert_allclose(np.asarray(traced), np.asarray(dense(q, k, v, vis)), atol=F32_TOL)


def test_reads_only_filled_slots():
  """Slots after the query's own are never read: garbage (NaN) there changes nothing."""
  q, k, v, _ = _inputs(3, 1, 4, 4, 2, 64)
  vis = attention.Visibility(jnp.int32(10), jnp.ones((1, 64), bool))
  poison = lambda a: a.at[:, :, 32:].set(jnp.nan)
  for t in (1, 4):
    clean = attention.attention(q[:, :t], k, v, vis, attention.Blocks(4, 16, 16))
    dirty = attention.attention(q[:, :t], poison(k), poison(v), vis, attention.Blocks(4, 16, 16))
    np.testing.assert_array_equal(np.asarray(clean), np.asarray(dirty))


def test_gradient_temporaries_stay_far_below_one_score_matrix():
  """The compiled forward + backward at 4096 tokens (4 heads) holds far less than the dense
  [h, t, t] float32 scores (256 MiB): it cannot hold a [t, s] matrix anywhere."""
  b, t, h, x = 1, 4096, 4, 64
  vis = attention.Visibility(0, jnp.ones((b, t), bool))
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention_kernels.attend(q, k, v, vis) ** 2),
                          argnums=(0, 1, 2)))
  temp = grad.lower(spec(b, t, h, x), spec(b, h, t, x), spec(b, h, t, x)).compile() \
      .memory_analysis().temp_size_in_bytes
  dense_scores = 4 * b * h * t * t
  assert temp < dense_scores / 8, (temp, dense_scores)


def _export_text(fn, args, platform):
  """The StableHLO text of fn exported for `platform` (the Triton call is not one of
  jax.export's stable custom calls: allowed here, as a CUDA deployment would)."""
  exported = jax.export.export(
      jax.jit(fn), platforms=[platform],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])
  return exported(*args).mlir_module()


@pytest.mark.parametrize("platform,kernel", [("tpu", "tpu_custom_call"),
                                             ("cuda", "__gpu$xla.gpu.triton")])
def test_accelerator_exports_carry_the_kernel(platform, kernel):
  """A cache-free causal pass (with padding) lowers to splash on TPU and the Pallas (Triton)
  flash kernel on CUDA, forward and backward; a chunk into a cache stays on the blocked path."""
  b, t, h, kv, x = 2, 256, 4, 2, 64
  bf16 = jnp.bfloat16
  args = (jax.ShapeDtypeStruct((b, t, h, x), bf16), jax.ShapeDtypeStruct((b, kv, t, x), bf16),
          jax.ShapeDtypeStruct((b, kv, t, x), bf16), jax.ShapeDtypeStruct((b, t), jnp.bool_))
  update = lambda q, k, v, valid: jax.grad(lambda q: jnp.sum(attention_kernels.attend(
      q, k, v, attention.Visibility(0, valid)).astype(jnp.float32)))(q)
  assert kernel in _export_text(update, args, platform)
  chunk = lambda q, k, v, valid: attention_kernels.attend(q, k, v, attention.Visibility(
      jnp.sum(valid[0]).astype(jnp.int32), valid))
  assert kernel not in _export_text(chunk, args, platform)
  assert "tpu_custom_call" not in _export_text(update, args, "cpu")


def test_kernel_coverage_is_stated():
  """What the kernels cover, as the module docstring says."""
  q = jnp.zeros((1, 256, 4, 64))
  k = jnp.zeros((1, 2, 256, 64))
  ones = jnp.ones((1, 256), bool)
  assert attention_kernels.covered(q, k, attention.Visibility(0, ones))
  assert not attention_kernels.covered(q, k, attention.Visibility(jnp.int32(0), ones))
  assert not attention_kernels.covered(q, k, attention.Visibility(0, ones, ones.astype(int)))
  assert not attention_kernels.covered(q[:, :200], k[:, :, :200], attention.Visibility(
      0, ones[:, :200]))


def test_too_long_sequences_are_refused():
  config = llm.LlmConfig(model_type="llama", vocab_size=tiny_models.VOCAB, hidden_size=16, intermediate_size=32,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                         max_position_embeddings=8)
  params = llm.init_random(config, jax.random.key(0))
  with pytest.raises(ValueError, match="9 tokens.*max_position_embeddings \\(8\\)"):
    llm.forward(params, config, jnp.zeros((1, 9), jnp.int32))
  cache = llm.init_cache(config, 1, 4)
  with pytest.raises(ValueError, match="5 tokens do not fit the cache's 4 slots"):
    llm.forward(params, config, jnp.zeros((1, 5), jnp.int32), cache=cache)
