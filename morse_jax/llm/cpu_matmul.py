"""The CPU kernel for a decode step's few-row weight products (`skinny_matmul_cpu.cc`, an XLA
FFI custom call built and registered by `cpu_kernels`).

`matmul(x, w)` is x [b, t, k] times w [n, k] (the model's [out, in] weights, the output head)
transposed, in float32: the kernel on a CPU backend for a decode step (one token a row, t = 1),
the einsum everywhere else (other platforms; prefill chunks, products of many rows that XLA's
dot runs well; without the kernels). `fused_decode`'s projections and `model.head_logits` call
it. Why a kernel: XLA:CPU ran SmolLM2's decode products at 10-13 GB/s for 4-8 rows, where one
read of the weights per step is the floor (RESULTS, "The decode step's weight products as a CPU
kernel"). Every decode step takes it, whatever its row count (at 32 rows or more XLA's dot is
as fast or up to a fifth faster): the kernel's result for a row does not depend on the rows
beside it, so a row's tokens do not depend on how many others are live.

The kernel takes x as float32 (a bfloat16 x converts exactly, and products of bfloat16 values
are exact in float32, as under the einsum's float32 accumulation), or, bfloat16 x by bfloat16
w, as it is: bf16 dot products (AVX512-BF16) with float32 sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from morse_jax.llm.cpu_kernels import available

_TARGETS = {jnp.dtype(jnp.float32): "morse_skinny_matmul_f32",
            jnp.dtype(jnp.bfloat16): "morse_skinny_matmul_bf16"}


def takes(x, w) -> bool:
  """Whether the kernel takes x [b, t, k] times w: one token a row, a weight dtype it reads."""
  return x.ndim == 3 and x.shape[1] == 1 and jnp.dtype(w.dtype) in _TARGETS and available()


def reference(x, w):
  """x [..., k] @ w [n, k]^T -> [..., n] float32, by XLA."""
  return jnp.einsum("...d,nd->...n", x, w, preferred_element_type=jnp.float32)


def _rows_and_target(x, w) -> tuple:
  """x as [rows, k] for the kernel and its target: bfloat16 x by bfloat16 w keeps x as it is
  (the kernel's bf16 dot products, `skinny_matmul_cpu.cc`); else x in float32."""
  rows = x.reshape(-1, x.shape[-1])
  if jnp.dtype(x.dtype) == jnp.dtype(w.dtype) == jnp.dtype(jnp.bfloat16):
    return rows, "morse_skinny_matmul_bf16x"
  return rows.astype(jnp.float32), _TARGETS[jnp.dtype(w.dtype)]


def kernel(x, w):
  """`reference` by the kernel (CPU only)."""
  rows, target = _rows_and_target(x, w)
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows.shape[0], w.shape[0]), jnp.float32))
  return call(rows, w).reshape(*x.shape[:-1], w.shape[0])


def layer_kernel(x, w, layer):
  """`reference(x, w[layer])` by the kernel (CPU only), w [layers, n, k] read in place."""
  rows, target = _rows_and_target(x, w)
  call = jax.ffi.ffi_call(target.replace("matmul", "matmul_layer"),
                          jax.ShapeDtypeStruct((rows.shape[0], w.shape[1]), jnp.float32))
  return call(rows, w, jnp.asarray(layer, jnp.int32)).reshape(*x.shape[:-1], w.shape[1])


def matmul(x, w):
  """x [b, t, k] @ w [n, k]^T -> [b, t, n] float32: the kernel where `takes(x, w)` on CPU."""
  if not takes(x, w):
    return reference(x, w)
  return jax.lax.platform_dependent(x, w, cpu=kernel, default=reference)
