"""The C++ few-row weight product (`llm/cpu_matmul.py`) against a float64 loop and the einsum it
replaces on CPU, and where it runs."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import cpu_kernels, cpu_matmul, model

if shutil.which(os.environ.get("CXX") or "g++") is None and shutil.which("c++") is None:
  pytest.skip("no C++ compiler: the kernel cannot be built here (the einsum runs)",
              allow_module_level=True)


def _case(m, k, n, dtype, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, 1, k)).astype(np.float32)
  w = np.asarray(jnp.asarray(rng.standard_normal((n, k)), dtype).astype(jnp.float32))
  return x, w


def _loop(x, w):
  """y[i, 0, j] = sum_c x[i, 0, c] w[j, c], in float64, one element at a time."""
  y = np.zeros((x.shape[0], 1, w.shape[0]))
  for i in range(x.shape[0]):
    for j in range(w.shape[0]):
      y[i, 0, j] = sum(float(a) * float(b) for a, b in zip(x[i, 0], w[j]))
  return y


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("m,k,n", [(1, 64, 8), (5, 70, 101), (9, 48, 67), (4, 16, 4),
                                   (17, 33, 130), (15, 40, 9)])
def test_kernel_equals_a_float64_loop(dtype, m, k, n):
  """Below 8 rows tiles of 4 and their tails by weight rows in groups of 4 and their tail; from
  8 rows tiles of 8 and their tails (1-7) by groups of 2 and their tail; k with and without a
  tail past the 16-lane chunks, more than one 64-row block."""
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  x, w = _case(m, k, n, dtype)
  got = np.asarray(jax.jit(cpu_matmul.kernel)(jnp.asarray(x), jnp.asarray(w, dtype)))
  np.testing.assert_allclose(got, _loop(x, w), rtol=1e-5, atol=1e-5 * np.sqrt(k))
  ref = np.asarray(cpu_matmul.reference(jnp.asarray(x), jnp.asarray(w, dtype)))
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_a_row_does_not_depend_on_the_rows_beside_it():
  """Bit for bit: a decode row's numbers whatever other rows share its step (13 rows: tiles of 8
  and 5 by weight pairs; alone and 5 rows: tiles of 4 by groups of 4)."""
  x, w = _case(13, 200, 77, jnp.float32)
  run = jax.jit(cpu_matmul.kernel)
  together = np.asarray(run(jnp.asarray(x), jnp.asarray(w)))
  for i in (0, 5, 12):
    alone = np.asarray(run(jnp.asarray(x[i:i + 1]), jnp.asarray(w)))
    np.testing.assert_array_equal(alone[0], together[i])
  rows = [3, 11, 4, 7, 2]  # in another company and order
  np.testing.assert_array_equal(np.asarray(run(jnp.asarray(x[rows]), jnp.asarray(w))),
                                together[rows])


def test_decode_steps_take_the_kernel_and_nothing_else():
  x, w = _case(4, 64, 96, jnp.float32)
  step = jax.jit(cpu_matmul.matmul).lower(jnp.asarray(x), jnp.asarray(w)).as_text()
  assert "morse_skinny_matmul_f32" in step
  chunk = jnp.zeros((2, 8, 64), jnp.float32)  # a prefill chunk: XLA's dot
  assert "morse_skinny_matmul" not in jax.jit(cpu_matmul.matmul).lower(chunk, w).as_text()
  head = jax.jit(model.head_logits).lower(jnp.asarray(x), jnp.asarray(w, jnp.bfloat16))
  assert "morse_skinny_matmul_bf16" in head.as_text()
  tpu = jax.export.export(jax.jit(cpu_matmul.matmul), platforms=["tpu"])(
      jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(w.shape, jnp.float32))
  assert "morse_skinny_matmul" not in tpu.mlir_module()


def test_without_the_kernel_the_einsum_runs(monkeypatch):
  x, w = _case(4, 64, 96, jnp.float32)
  monkeypatch.setattr(cpu_kernels, "_state", {"ok": False, "reason": "test"})
  fresh = jax.jit(lambda x, w: cpu_matmul.matmul(x, w))  # not a trace cached with the kernel
  assert "morse_skinny_matmul" not in fresh.lower(jnp.asarray(x), jnp.asarray(w)).as_text()
  assert cpu_kernels.unavailable_reason() == "test"


def test_a_bad_shape_is_an_error_naming_the_shapes():
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  call = jax.ffi.ffi_call("morse_skinny_matmul_f32", jax.ShapeDtypeStruct((2, 5), jnp.float32))
  with pytest.raises(Exception, match=r"shapes do not agree \(x 2x8, w \[out, in\] 5x7\)"):
    jax.block_until_ready(call(jnp.zeros((2, 8)), jnp.zeros((5, 7))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_layer_of_the_stack_read_in_place(dtype):
  """`layer_kernel(x, w, i)` is the product with w[i], for a literal and a traced i; the stacked
  decode lowers to the layer kernel with no slice of the stack."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3, 1, 40)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((4, 24, 40)), dtype)
  for i in range(4):
    want = cpu_matmul.reference(x, w[i])
    np.testing.assert_array_equal(jax.jit(cpu_matmul.layer_kernel, static_argnums=2)(x, w, i),
                                  jax.jit(cpu_matmul.kernel)(x, w[i]))
    np.testing.assert_allclose(jax.jit(cpu_matmul.layer_kernel)(x, w, jnp.int32(i)), want,
                               rtol=1e-5, atol=1e-4)
  with pytest.raises(Exception, match="layer 4 out of range for 4 layers"):
    jax.block_until_ready(cpu_matmul.layer_kernel(x, w, jnp.int32(4)))


def test_the_stored_layers_decode_on_the_layer_kernel():
  cfg = llm.LlmConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8)
  params = llm.init_random(cfg, jax.random.key(0), dtype=jnp.bfloat16, scale=0.3)
  project = model.StackedProjections(params.layers, 1)
  lp = jax.tree.map(lambda a: a[1], params.layers)
  h = jnp.ones((2, 1, 32), jnp.bfloat16)
  down = jax.jit(lambda m: project.down(m, lp, None, None))
  text = down.lower(jnp.ones((2, 1, 48), jnp.bfloat16)).as_text()
  assert "morse_skinny_matmul_layer_bf16" in text
  got = jax.jit(lambda h: project.qkv(h, lp, None, None, cfg))(h)
  want = model.STORED.qkv(h, lp, None, None, cfg)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2)


@pytest.mark.parametrize("m,k,n", [(1, 64, 8), (5, 70, 101), (9, 48, 67), (17, 33, 130)])
def test_bfloat16_x_by_bfloat16_w_equals_a_float64_loop(m, k, n):
  """A bf16 model's decode (bf16 activations, bf16 weights): the kernel's bf16 dot products
  (pairs of k into 16 float32 lanes, then the tail past 32) against float64 sums of the same
  bf16 values; every tile shape and tail, the layer form too."""
  assert cpu_kernels.available(), cpu_kernels.unavailable_reason()
  x, w = _case(m, k, n, jnp.bfloat16)
  xb, wb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
  want = _loop(np.asarray(xb.astype(jnp.float32)), np.asarray(wb.astype(jnp.float32)))
  got = np.asarray(jax.jit(cpu_matmul.kernel)(xb, wb))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
  assert "morse_skinny_matmul_bf16x" in jax.jit(cpu_matmul.kernel).lower(xb, wb).as_text()
  stack = jnp.stack([wb * 2, wb])
  layer = np.asarray(jax.jit(cpu_matmul.layer_kernel)(xb, stack, 1))
  np.testing.assert_array_equal(layer, got)
  together = got
  for i in range(0, m, 4):  # a row alone: the same bits
    np.testing.assert_array_equal(np.asarray(cpu_matmul.kernel(xb[i:i + 1], wb))[0], together[i])
