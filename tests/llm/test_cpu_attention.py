"""The C++ decode attention over pages (`llm/cpu_attention.py`) against the plain-JAX loop it
replaces on CPU (`paged.paged_attention_loop`)."""

import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax.llm import cpu_attention, cpu_kernels, paged

if shutil.which(os.environ.get("CXX") or "g++") is None and shutil.which("c++") is None:
  pytest.skip("no C++ compiler: the kernel cannot be built here (the JAX loop runs)",
              allow_module_level=True)

P = 16


def _case(b, t, h, kvh, x, ctx, dtype, seed=0):
  """A pool with each row's pages shuffled over it, unused pages and slots full of NaN (a key
  the kernel should never read), ragged lengths with an idle row."""
  rng = np.random.default_rng(seed)
  n = -(-ctx // P) + 2
  num_pages = b * n + 1
  pool_k = rng.standard_normal((num_pages, kvh, P, x)).astype(np.float32)
  pool_v = rng.standard_normal((num_pages, kvh, P, x)).astype(np.float32)
  kv_len = rng.integers(1, ctx, b).astype(np.int32)
  kv_len[1] = 0  # an idle row: zeros
  pages = (1 + rng.permutation(b * n)).reshape(b, n).astype(np.int32)
  for r in range(b):
    used = -(-int(kv_len[r]) // P)
    pages[r, used:] = 0  # the trash page, as the engine's tables have it
    if used:  # the row's last page past its length: NaN, as a page another row left
      pool_k[pages[r, used - 1], :, (kv_len[r] - 1) % P + 1:] = np.nan
      pool_v[pages[r, used - 1], :, (kv_len[r] - 1) % P + 1:] = np.nan
  pool_k[0], pool_v[0] = np.nan, np.nan
  # t queries at the row's last t positions (a decode pass writes its own first)
  q_pos = np.maximum(kv_len[:, None] - t + np.arange(t)[None], 0).astype(np.int32)
  q = rng.standard_normal((b, t, h, x)).astype(np.float32)
  cast = lambda a: jnp.asarray(a, dtype)
  return (jnp.asarray(q), cast(pool_k), cast(pool_v), jnp.asarray(pages), jnp.asarray(q_pos),
          jnp.asarray(kv_len))


def _nan_free_loop(args):
  """The loop's result on the same pool with the NaNs made zero (the loop masks values, but
  q . k of a NaN key is NaN before its mask; the kernel never reads them)."""
  q, pk, pv, pages, q_pos, kv_len = args
  clean = lambda a: jnp.where(jnp.isnan(a), jnp.zeros_like(a), a)
  return paged.paged_attention_loop(q, clean(pk), clean(pv), pages, q_pos, kv_len, block_pages=4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("b,t,h,kvh,x,ctx", [(5, 1, 9, 3, 64, 300), (4, 3, 3, 1, 32, 70),
                                             (3, 1, 4, 4, 16, 40)])
def test_kernel_equals_the_jax_loop(dtype, b, t, h, kvh, x, ctx):
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  args = _case(b, t, h, kvh, x, ctx, dtype)
  got = jax.jit(cpu_attention.attend)(*args)
  want = _nan_free_loop(args)
  assert got.shape == want.shape and got.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(got)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=2e-6)
  assert not np.any(np.asarray(got)[1])  # the idle row sees no key: zeros


def test_a_pool_of_bfloat16_bits_reads_as_bfloat16():
  """The engine stores a bfloat16 pool as its uint16 bits (paged.init_pool): the kernel and the
  loop read them as the bfloat16 values."""
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  q, pk, pv, pages, q_pos, kv_len = _case(5, 1, 9, 3, 64, 300, jnp.bfloat16)
  bits = lambda a: jax.lax.bitcast_convert_type(a, jnp.uint16)
  want = jax.jit(cpu_attention.attend)(q, pk, pv, pages, q_pos, kv_len)
  attend = functools.partial(cpu_attention.attend, dtype=jnp.bfloat16)
  got = jax.jit(attend)(q, bits(pk), bits(pv), pages, q_pos, kv_len)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  clean = lambda a: jnp.where(jnp.isnan(a), jnp.zeros_like(a), a)
  loop = paged.paged_attention_loop(q, bits(clean(pk)), bits(clean(pv)), pages, q_pos, kv_len,
                                    block_pages=4, dtype=jnp.bfloat16)
  np.testing.assert_allclose(np.asarray(got), np.asarray(loop), atol=2e-6, rtol=2e-6)
  assert cpu_attention.takes(q, bits(pk), jnp.bfloat16)
  assert not cpu_attention.takes(q, bits(pk))  # bits without their dtype: not the kernel's


def test_kernel_equals_the_loop_when_scores_span_hundreds():
  """Scores far below the block's largest: the kernel's exp (cpu_vector.h's exp16, clamped at
  -87.3) against jnp.exp, where most weights underflow."""
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  q, *rest = _case(5, 1, 9, 3, 64, 300, jnp.float32)
  args = (q * 40.0, *rest)
  got = jax.jit(cpu_attention.attend)(*args)
  want = _nan_free_loop(args)
  assert bool(jnp.all(jnp.isfinite(got)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_paged_attention_dispatches_to_the_kernel_on_cpu_only():
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  args = _case(4, 1, 9, 3, 64, 100, jnp.float32)
  fn = jax.jit(functools.partial(paged.paged_attention, block_pages=4))
  assert "morse_paged_attention_f32" in fn.lower(*args).as_text()
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  tpu = jax.export.export(fn, platforms=["tpu"])(*shapes).mlir_module()
  assert "morse_paged_attention" not in tpu  # other platforms lower the JAX loop
  prefill = _case(2, 8, 9, 3, 64, 100, jnp.float32)  # a prefill chunk: the loop, on CPU too
  assert "morse_paged_attention" not in fn.lower(*prefill).as_text()


def test_without_the_kernel_the_loop_runs(monkeypatch):
  args = _case(4, 1, 9, 3, 64, 100, jnp.float32)
  monkeypatch.setattr(cpu_kernels, "_state", {"ok": False, "reason": "test"})
  fn = jax.jit(functools.partial(paged.paged_attention, block_pages=4))
  assert "morse_paged_attention" not in fn.lower(*args).as_text()
  assert cpu_kernels.unavailable_reason() == "test"


def test_a_bad_shape_is_an_error_naming_the_shapes():
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  q, pk, pv, pages, q_pos, kv_len = _case(4, 1, 9, 3, 64, 100, jnp.float32)
  with pytest.raises(Exception, match="shapes do not agree"):
    jax.block_until_ready(cpu_attention.attend(q, pk, pv, pages[:3], q_pos, kv_len))
