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
# (pool storage dtype, the keys' dtype) -> the custom call's target name (`cpu_kernels.TARGETS`);
# a bfloat16 pool may be stored as its uint16 bits (`paged.init_pool`)
_TARGETS = {(jnp.dtype(jnp.float32),) * 2: "morse_paged_attention_f32",
            (jnp.dtype(jnp.bfloat16),) * 2: "morse_paged_attention_bf16",
            (jnp.dtype(jnp.uint16), jnp.dtype(jnp.bfloat16)): "morse_paged_attention_bf16_bits"}


def _target(pool_k, dtype=None) -> str | None:
  return _TARGETS.get((jnp.dtype(pool_k.dtype), jnp.dtype(dtype or pool_k.dtype)))


def takes(q, pool_k, dtype=None) -> bool:
  """Whether `attend` takes this pass: few queries a row, a pool the kernel reads (`dtype`: the
  keys' dtype where the pool holds their bits; None: the pool's own)."""
  return q.shape[1] <= MAX_QUERIES and _target(pool_k, dtype) is not None and available()


def attend(q, pool_k, pool_v, pages, q_pos, kv_len, dtype=None):
  """`paged.paged_attention`'s result by the kernel: q [b, t, h, x], pool_k / pool_v
  [pages, kv, P, x], pages [b, n], q_pos [b, t], kv_len [b] -> [b, t, h, x] float32."""
  call = jax.ffi.ffi_call(_target(pool_k, dtype), jax.ShapeDtypeStruct(q.shape, jnp.float32))
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  return call(q.astype(jnp.float32), pool_k, pool_v, i32(pages), i32(q_pos), i32(kv_len))
