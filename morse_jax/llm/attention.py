"""One attention for every pass (update, chunked prefill, decode) that never holds more than one
block of scores: a blocked online softmax (flash attention) in plain JAX, with a custom VJP that
saves only q, k, v, the output and the log-sum-exp and recomputes each block's scores in the
backward pass (flash-attention-2's backward). Kernels replace it when lowering for an
accelerator, where they cover the case (`attention_kernels.py`, whose `attend` is the entry point).

Which keys a query sees is described by `Visibility` (O(t + s) numbers), never by a [t, s] mask:
query i sits at cache slot `q_start + i` and sees the key slots <= its own (causal) whose
`k_valid` is True and, with `segments`, those of segment 0 or of its own segment. A query that
sees no key (a left-padding row) gets zeros.

Layout: q [b, t, h, x], k and v [b, kv, s, x] (GQA without repeating k / v: query head
kv * g + j reads kv head kv). Blocks of scores are [b, kv, g, block_q, block_k] float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

_NEG = -1e30  # finite: a block where a row sees nothing keeps its running max, never NaN

# Query rows / key slots per block of scores (at most: `block_size`). On XLA:CPU 256 x 256 ran
# the attention's forward + backward 1.2-2.7x faster than 512 x 512 at 768-3072 tokens
# (`benchmarks.attention_blocks`; RESULTS "Attention blocks sized to divide").
BLOCK_Q = 256
BLOCK_K = 256
DECODE_BLOCK_K = 256  # key slots per step of a one-token query's loop


class Visibility(NamedTuple):
  """Which key slots each query sees, in O(t + s) numbers.

  q_start: [] int (a Python int where it is known when tracing: 0 for cache-free passes) the slot
    of the first query; query i sits at slot q_start + i and sees slots <= q_start + i.
  k_valid: [b, s] bool, the slot holds a real token (left padding and holes are False).
  segments: None, or [b, t] int for a cache-free pass (q_start 0, s == t) packing several
    sequences that share a prefix: segment 0 is seen by every later token, a token of segment
    k >= 1 sees segment 0 and the earlier tokens of segment k.
  """

  q_start: jax.Array | int
  k_valid: jax.Array
  segments: jax.Array | None = None


class Blocks(NamedTuple):
  """Static block sizes (hashable: a custom_vjp's non-differentiable argument)."""

  q: int = BLOCK_Q
  k: int = BLOCK_K
  decode_k: int = DECODE_BLOCK_K


def attention(q, k, v, vis: Visibility, blocks: Blocks = Blocks()):
  """Softmax(q k^T / sqrt(x)) v over the visible keys: [b, t, h, x] -> [b, t, h, x] (v's dtype).

  The blocked path in the operands' dtype, differentiable in q, k and v; `attention_kernels.attend` is
  the entry point that chooses a kernel or this per platform."""
  b, t, h, x = q.shape
  kv, s = k.shape[1], k.shape[2]
  if h % kv:
    raise ValueError(f"attention: {h} query heads are not a multiple of {kv} kv heads")
  if vis.k_valid.shape != (b, s):
    raise ValueError(f"attention: k_valid has shape {vis.k_valid.shape}, want {(b, s)}")
  if vis.segments is not None and (vis.segments.shape != (b, t) or s != t):
    raise ValueError(f"attention: segments {vis.segments.shape} need a cache-free pass with "
                     f"[b, t] = {(b, t)} and as many keys as queries (got {s})")
  bq = block_size(t, blocks.q)
  tp = -(-t // bq) * bq  # queries padded to whole blocks (keys are not: see `_key_block`)
  qg = q.reshape(b, t, kv, h // kv, x).transpose(0, 2, 3, 1, 4)  # [b, kv, g, t, x]
  segments = vis.segments
  if tp != t:
    qg = jnp.pad(qg, ((0, 0),) * 3 + ((0, tp - t), (0, 0)))
    if segments is not None:
      segments = jnp.pad(segments, ((0, 0), (0, tp - t)))
  sizes = _Sizes(t=t, bq=bq, bk=block_size(s, blocks.k), decode_bk=min(blocks.decode_k, s))
  q_start = jnp.asarray(vis.q_start, jnp.int32)
  out = _flash(sizes, qg, k, v, q_start, vis.k_valid, segments)
  return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, x)


def block_size(n: int, block: int) -> int:
  """The block for n rows (or slots): n itself up to `block`, else the largest divisor of n
  between block / 2 and block, so that no block is padded (768 -> 256, 384 -> 192, 1000 -> 250);
  `block` when n has none (the last query block padded, the last key block shifted back)."""
  if n <= block:
    return n
  return next((d for d in range(block, max(block // 2, 1) - 1, -1) if n % d == 0), block)


class _Sizes(NamedTuple):
  t: int  # real queries (the rest of the last block is padding)
  bq: int
  bk: int
  decode_bk: int


def _key_block(a, j, bk, axis):
  """Key block j of a along `axis` and its first slot. The start is clamped so the block stays
  inside a (slots need not be a multiple of bk: no padded copy of the cache); the slots before
  j * bk, which an earlier block covered, are masked out by `_visible`."""
  start = jnp.minimum(j * bk, a.shape[axis] - bk)
  return jax.lax.dynamic_slice_in_dim(a, start, bk, axis), start


def _visible(sizes, q_start, i, k_first, j, k_valid_blk, seg_q, seg_k):
  """[b, 1, 1, bq, bk] bool: query block i sees key block j (first slot k_first)."""
  q_idx = i * sizes.bq + jnp.arange(sizes.bq)
  q_slot = q_start + q_idx
  k_slot = k_first + jnp.arange(k_valid_blk.shape[1])
  ok = (k_slot[None, :] <= q_slot[:, None]) & (k_slot[None, :] >= j * sizes.bk)
  ok = ok & (q_idx < sizes.t)[:, None]
  ok = ok[None] & k_valid_blk[:, None, :]
  if seg_q is not None:
    ok = ok & ((seg_k[:, None, :] == 0) | (seg_q[:, :, None] == seg_k[:, None, :]))
  return ok[:, None, None]


def _key_blocks_seen(sizes, q_start, q_end, s):
  """How many key blocks the queries before slot q_end (exclusive) read: the blocks up to the
  one holding slot q_end - 1, never past the cache ("read only what is filled")."""
  return jnp.minimum(-(-q_end // sizes.bk), -(-s // sizes.bk))


def _scores(qb, kb):
  """[b, kv, g, bq, x] x [b, kv, bk, x] -> [b, kv, g, bq, bk] float32 (scaled)."""
  s = jnp.einsum("bkgqx,bksx->bkgqs", qb, kb, preferred_element_type=jnp.float32)
  return s * (qb.shape[-1] ** -0.5)


def _forward_block_rows(sizes, qg, k, v, q_start, k_valid, segments, i):
  """Output [b, kv, g, bq, x] float32 and log-sum-exp [b, kv, g, bq] of query block i: a loop
  over the key blocks it can see, carrying the running max, sum and output."""
  b, kvh, g, _, x = qg.shape
  s = k.shape[2]
  qb = jax.lax.dynamic_slice_in_dim(qg, i * sizes.bq, sizes.bq, axis=3)
  seg_q = None if segments is None else jax.lax.dynamic_slice_in_dim(
      segments, i * sizes.bq, sizes.bq, axis=1)
  q_end = q_start + jnp.minimum((i + 1) * sizes.bq, sizes.t)

  def body(j, carry):
    m, l, acc = carry
    kb, k_first = _key_block(k, j, sizes.bk, 2)
    vb, _ = _key_block(v, j, sizes.bk, 2)
    valid_b = jax.lax.dynamic_slice_in_dim(k_valid, k_first, sizes.bk, axis=1)
    seg_k = None if segments is None else jax.lax.dynamic_slice_in_dim(
        segments, k_first, sizes.bk, axis=1)
    ok = _visible(sizes, q_start, i, k_first, j, valid_b, seg_q, seg_k)
    sc = jnp.where(ok, _scores(qb, kb), _NEG)
    m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
    p = jnp.where(ok, jnp.exp(sc - m_new[..., None]), 0.0)
    scale = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgqs,bksx->bkgqx", p.astype(vb.dtype), vb,
                    preferred_element_type=jnp.float32)
    return m_new, l * scale + jnp.sum(p, axis=-1), acc * scale[..., None] + pv

  init = (jnp.full((b, kvh, g, sizes.bq), _NEG, jnp.float32),
          jnp.zeros((b, kvh, g, sizes.bq), jnp.float32),
          jnp.zeros((b, kvh, g, sizes.bq, x), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, _key_blocks_seen(sizes, q_start, q_end, s), body, init)
  return _finish(m, l, acc)


def _finish(m, l, acc):
  """Normalised output and log-sum-exp; rows that saw nothing: zeros (lse 0, unused)."""
  seen = l > 0
  out = acc / jnp.where(seen, l, 1.0)[..., None]
  return out, jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)


def decode_prefixes(s: int, block: int) -> tuple[int, ...]:
  """The key prefixes a one-token query reads: block * 2^i slots, then all s."""
  sizes = [block]
  while sizes[-1] < s:
    sizes.append(min(2 * sizes[-1], s))
  return tuple(sizes)


def _decode_rows(sizes, qg, k, v, q_start, k_valid):
  """One query per row (decode): reads the smallest prefix of `decode_prefixes` holding the
  query's own slot (the slots after it are not filled yet), chosen by `lax.switch`, with products
  and sums that read k and v once. Both choices are for XLA:CPU: as two batched dots (b * kv
  batches of [g, x] x [x, s]) it ran a SmolLM2 decode step's attention 2.5x slower (measured at
  8 rows, 640 slots), and a loop over key blocks pays its per-iteration overhead in every layer
  of every step."""
  x = qg.shape[-1]
  q1 = qg[:, :, :, 0].astype(jnp.float32) * (x ** -0.5)  # [b, kv, g, x]

  def prefix(n):
    def attend(q1, k, v, k_valid, q_start):
      ok = (k_valid[:, :n] & (jnp.arange(n) <= q_start))[:, None, None, :]  # [b, 1, 1, n]
      sc = jnp.sum(q1[:, :, :, None, :] * k[:, :, None, :n].astype(jnp.float32), axis=-1)
      m = jnp.max(jnp.where(ok, sc, _NEG), axis=-1)
      p = jnp.where(ok, jnp.exp(sc - m[..., None]), 0.0)
      acc = jnp.sum(p[..., None] * v[:, :, None, :n].astype(jnp.float32), axis=-2)
      return _finish(m, jnp.sum(p, axis=-1), acc)
    return attend

  lengths = decode_prefixes(k.shape[2], sizes.decode_bk)
  which = jnp.sum(jnp.asarray(lengths[:-1]) <= q_start)  # the first prefix past q_start
  out, lse = jax.lax.switch(which, [prefix(n) for n in lengths], q1, k, v, k_valid, q_start)
  return out[:, :, :, None], lse[:, :, :, None]


def _forward(sizes, qg, k, v, q_start, k_valid, segments):
  """(output [b, kv, g, tp, x] in v's dtype, lse [b, kv, g, tp] float32)."""
  tp = qg.shape[3]
  if tp == 1:
    out, lse = _decode_rows(sizes, qg, k, v, q_start, k_valid)
    return out.astype(v.dtype), lse
  rows = lambda i: _forward_block_rows(sizes, qg, k, v, q_start, k_valid, segments, i)
  out, lse = jax.lax.map(rows, jnp.arange(tp // sizes.bq))  # [n, b, kv, g, bq, (x)]
  out = jnp.moveaxis(out, 0, 3).reshape(qg.shape[:3] + (tp, qg.shape[-1]))
  lse = jnp.moveaxis(lse, 0, 3).reshape(qg.shape[:3] + (tp,))
  return out.astype(v.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(sizes, qg, k, v, q_start, k_valid, segments):
  return _forward(sizes, qg, k, v, q_start, k_valid, segments)[0]


def _flash_fwd(sizes, qg, k, v, q_start, k_valid, segments):
  out, lse = _forward(sizes, qg, k, v, q_start, k_valid, segments)
  return out, (qg, k, v, q_start, k_valid, segments, out, lse)


def _flash_bwd(sizes, res, d_out):
  """Flash-attention-2's backward: for each key block, the query blocks that see it, with the
  scores recomputed from the saved lse; dk and dv of the block accumulate in the inner loop, dq
  in a carried [b, kv, g, tp, x] array. Nothing larger than one block of scores is held."""
  qg, k, v, q_start, k_valid, segments, out, lse = res
  tp, bq, bk, s = qg.shape[3], sizes.bq, sizes.bk, k.shape[2]
  d_out = d_out.astype(jnp.float32)
  delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [b, kv, g, tp]
  n_keys = _key_blocks_seen(sizes, q_start, q_start + sizes.t, s)

  def key_step(j, carry):
    dq, dk, dv = carry
    kb, k_first = _key_block(k, j, bk, 2)
    vb, _ = _key_block(v, j, bk, 2)
    valid_b = jax.lax.dynamic_slice_in_dim(k_valid, k_first, bk, axis=1)
    seg_k = None if segments is None else jax.lax.dynamic_slice_in_dim(
        segments, k_first, bk, axis=1)

    def query_step(i, inner):
      dq, dkb, dvb = inner
      rows = lambda a: jax.lax.dynamic_slice_in_dim(a, i * bq, bq, axis=3)
      qb, dob, lseb, deltab = rows(qg), rows(d_out), rows(lse), rows(delta)
      seg_q = None if segments is None else jax.lax.dynamic_slice_in_dim(
          segments, i * bq, bq, axis=1)
      ok = _visible(sizes, q_start, i, k_first, j, valid_b, seg_q, seg_k)
      p = jnp.where(ok, jnp.exp(_scores(qb, kb) - lseb[..., None]), 0.0)
      dvb = dvb + jnp.einsum("bkgqs,bkgqx->bksx", p, dob)
      dp = jnp.einsum("bkgqx,bksx->bkgqs", dob, vb, preferred_element_type=jnp.float32)
      ds = p * (dp - deltab[..., None]) * (qb.shape[-1] ** -0.5)
      dqb = jnp.einsum("bkgqs,bksx->bkgqx", ds, kb, preferred_element_type=jnp.float32)
      dq = jax.lax.dynamic_update_slice_in_dim(dq, rows(dq) + dqb, i * bq, axis=3)
      dkb = dkb + jnp.einsum("bkgqs,bkgqx->bksx", ds, qb, preferred_element_type=jnp.float32)
      return dq, dkb, dvb

    zeros = jnp.zeros(kb.shape, jnp.float32)
    first = jnp.maximum(j * bk - q_start, 0) // bq  # the first query block that sees block j
    dq, dkb, dvb = jax.lax.fori_loop(first, tp // bq, query_step, (dq, zeros, zeros))
    add = lambda a, blk: jax.lax.dynamic_update_slice_in_dim(
        a, jax.lax.dynamic_slice_in_dim(a, k_first, bk, axis=2) + blk, k_first, axis=2)
    return dq, add(dk, dkb), add(dv, dvb)

  init = (jnp.zeros(qg.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
          jnp.zeros(v.shape, jnp.float32))
  dq, dk, dv = jax.lax.fori_loop(0, n_keys, key_step, init)
  return (dq.astype(qg.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)
