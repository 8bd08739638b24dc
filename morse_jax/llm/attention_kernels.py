"""`attend`: the attention of every pass, with the accelerator kernel it chooses when lowering
where one covers the case, and which cases they cover.

Covered: the cache-free causal pass without segments (the update without a shared prefix, and a
prefill without a cache), q_start 0, as many keys as queries, a length that is a multiple of
128. Padding (left, right or holes) goes in as segment ids (1 real, 0 padding): a real query
then sees only real keys, a padding query only padding keys (its output is never read: no real
token sees a padding slot).

- TPU: Pallas splash attention (`make_splash_mha_single_device`, causal mask, segment ids;
  GQA natively: q heads per kv head), vmapped over rows.
- CUDA: the Pallas GPU flash attention (`pallas.ops.gpu.attention.mha`, Triton; causal, segment
  ids), k and v repeated to the query heads (the kernel takes equal head counts: O(s) memory).
  cuDNN's `jax.nn.dot_product_attention` is not used: it cannot be lowered without a GPU here
  (no test could show the export), and its lengths describe right padding only.

Not covered (the blocked path of `attention.py` runs there on every platform):
- decode (t == 1) and chunked prefill into a cache: the first query's slot is a traced value
  (`cache.length`), where both kernels take static causal offsets;
- shared-prefix segments: segment 0 is seen by every segment, which is not segment-id equality;
- lengths that are not a multiple of 128 (the kernels' smallest blocks);
- head dims other than 64 or 128 on TPU (splash lays the head dim on 128 lanes; 64 is padded).
- programs partitioned over a mesh of several devices (the `gpu8` / `tpu_v5e8` updates): XLA
  cannot partition a Mosaic kernel and would gather a Triton call's operands; wrapping the
  kernels in a `shard_map` over rows and kv heads is what would cover them (not done).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from morse_jax.llm import attention
from morse_jax.llm.attention import Visibility

KERNEL_BLOCK = 128  # the smallest block both kernels take: lengths must be a multiple of it


def covered(q, k, vis: Visibility) -> bool:
  """Whether the kernels cover this call (see the module docstring)."""
  t, s, x = q.shape[1], k.shape[2], q.shape[-1]
  return (isinstance(vis.q_start, int) and vis.q_start == 0 and vis.segments is None
          and s == t and t % KERNEL_BLOCK == 0 and x in (64, 128) and not _partitioned(q))


def _partitioned(q) -> bool:
  """Whether q lives on a mesh of several devices (the program is partitioned by GSPMD): XLA
  cannot partition a Mosaic call ("Mosaic kernels cannot be automatically partitioned") and
  would replicate a Triton call's operands, so those programs keep the blocked path."""
  mesh = getattr(jax.typeof(q).sharding, "mesh", None)
  return mesh is not None and mesh.size > 1


def for_platforms(q, k, v, vis: Visibility) -> dict:
  """{platform: fn(q, k, v)} for `lax.platform_dependent`: the kernels covering this call."""
  if not covered(q, k, vis):
    return {}
  ids = vis.k_valid.astype(jnp.int32)  # [b, s]: 1 real, 0 padding
  return {"tpu": lambda q, k, v: splash(q, k, v, ids),
          "cuda": lambda q, k, v: pallas_gpu(q, k, v, ids)}


def _block(t: int, most: int = 512) -> int:
  """The largest power-of-two block <= most dividing t (t is a multiple of 128)."""
  b = most
  while t % b:
    b //= 2
  return b


def splash(q, k, v, ids):
  """TPU splash attention: q [b, t, h, x], k / v [b, kv, t, x], ids [b, t] -> [b, t, h, x]."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as kernel_lib, splash_attention_mask as mask_lib)

  b, t, h, x = q.shape
  blk = _block(t)
  sizes = kernel_lib.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk,
                                block_q_dkv=blk, block_kv_dkv=blk, block_kv_dkv_compute=blk,
                                block_q_dq=blk, block_kv_dq=blk)
  mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((t, t)) for _ in range(h)])
  kernel = kernel_lib.make_splash_mha_single_device(mask, block_sizes=sizes)
  qh = (q * (x ** -0.5)).astype(q.dtype).transpose(0, 2, 1, 3)  # splash does not scale
  one = lambda q, k, v, ids: kernel(q, k, v, segment_ids=kernel_lib.SegmentIds(ids, ids))
  out = jax.vmap(one)(qh, k, v, ids)  # [b, h, t, x]
  return out.transpose(0, 2, 1, 3).astype(v.dtype)


def pallas_gpu(q, k, v, ids):
  """CUDA Pallas (Triton) flash attention: same arguments and result as `splash`."""
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention

  h, kv = q.shape[2], k.shape[1]
  repeat = lambda a: jnp.repeat(a.transpose(0, 2, 1, 3), h // kv, axis=2)  # [b, t, h, x]
  return _mha(q, repeat(k), repeat(v), ids, gpu_attention).astype(v.dtype)


def _mha(q, k, v, ids, gpu_attention):
  t, x = q.shape[1], q.shape[-1]
  blk = _block(t, 128)
  sizes = gpu_attention.BlockSizes(block_q=blk, block_k=blk, block_q_dkv=32, block_kv_dkv=32,
                                   block_q_dq=32, block_kv_dq=32)
  return gpu_attention.mha(q, k, v, ids, sm_scale=x ** -0.5, causal=True, block_sizes=sizes)


def attend(q, k, v, vis: Visibility, blocks: attention.Blocks = attention.Blocks()):
  """`attention.attention`, with the kernel of the platform lowered for where one covers the case
  (`for_platforms`), chosen when lowering (`lax.platform_dependent`): a TPU or
  CUDA export made on this CPU carries the kernel, a CPU run the blocked path.

  XLA:CPU has no batched bf16 x bf16 -> f32 dot ("Unsupported element type for DotThunk"), so on
  CPU 16-bit operands go up to float32 first (for the platform lowered for, not the host's
  default backend); accelerators get the 16-bit dots."""
  blocked = lambda q, k, v: attention.attention(q, k, v, vis, blocks)
  upcast = lambda q, k, v: attention.attention(*(a.astype(jnp.float32) for a in (q, k, v)), vis,
                                     blocks).astype(v.dtype)
  kernels = for_platforms(q, k, v, vis)
  if q.dtype == jnp.float32 and not kernels:
    return blocked(q, k, v)
  return jax.lax.platform_dependent(
      q, k, v, cpu=blocked if q.dtype == jnp.float32 else upcast, default=blocked, **kernels)
