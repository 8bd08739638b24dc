"""The CPU kernel for the engine's decode attention over pages (`paged_attention_cpu.cc`, an XLA
FFI custom call built and registered by `cpu_kernels`).

`paged.paged_attention` calls `attend` for a pass of at most `MAX_QUERIES` queries a row on a
CPU backend (the engine's decode step: one token a row) and keeps its plain-JAX loop everywhere
else (prefill chunks are matrix products XLA runs well; TPU and GPU lower the JAX loop or their
own kernels). Why a kernel: XLA:CPU ran that loop at ~5 GB/s, gathering each block of pages once
per token; SmolLM2's decode step spent about three quarters of its time there (RESULTS, "The
engine's decode attention on CPU"). Without the kernels (`cpu_kernels.available()` False) the
JAX loop runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from morse_jax.llm.cpu_kernels import available

MAX_QUERIES = 4  # queries a row up to which the kernel runs (decode: 1)
# pool dtype -> the custom call's target name (`cpu_kernels.TARGETS`)
_TARGETS = {jnp.dtype(jnp.float32): "morse_paged_attention_f32",
            jnp.dtype(jnp.bfloat16): "morse_paged_attention_bf16"}


def takes(q, pool_k) -> bool:
  """Whether `attend` takes this pass: few queries a row, a pool dtype the kernel reads."""
  return (q.shape[1] <= MAX_QUERIES and jnp.dtype(pool_k.dtype) in _TARGETS
          and available())


def attend(q, pool_k, pool_v, pages, q_pos, kv_len):
  """`paged.paged_attention`'s result by the kernel: q [b, t, h, x], pool_k / pool_v
  [pages, kv, P, x], pages [b, n], q_pos [b, t], kv_len [b] -> [b, t, h, x] float32."""
  call = jax.ffi.ffi_call(_TARGETS[jnp.dtype(pool_k.dtype)],
                          jax.ShapeDtypeStruct(q.shape, jnp.float32))
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  return call(q.astype(jnp.float32), pool_k, pool_v, i32(pages), i32(q_pos), i32(kv_len))
