"""The decoder over a paged KV cache: what the engine's prefill and decode programs run.

KV lives in a pool of pages, `PagePool` k and v [layers, pages, kv heads, page size, head dim];
a row's page-table entry j holds the page of its positions [j * P, (j + 1) * P). A row's
token at position p is written at (table[p // P], p % P); there is no left padding: positions
are slots, and a row sees the keys at positions < its length (and <= the query's own).

`paged_attention` reads a row's pages through its table, `block_pages` pages per step of an
online softmax (flash attention's loop with a block of pages as its key block), up to the
longest row's length. Plain JAX, so it runs everywhere (`paged_attention_loop`); a decode pass
on CPU runs a C++ kernel over the same layout instead (`cpu_attention`); on TPU,
`jax.experimental.pallas.ops.tpu.paged_attention` takes the same pool layout ([kv heads, pages,
page size, head dim] per layer after a transpose) and page table for the decode step, and a GPU
paged kernel (vLLM's, FlashInfer's) would slot in at the same call.

The layer (`_layer`) is `model.layer` with the cache write and the attention read through the
pages; projections, norms and RoPE are model.py's own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from morse_jax.llm import cpu_attention, fused_decode, model
from morse_jax.llm.config import LlmConfig
from morse_jax.llm.pages import TRASH_PAGE
from morse_jax.llm.params import Params

_NEG = -1e30  # finite, as in attention.py: a block a row sees nothing of never makes NaN


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagePool:
  # Per layer [pages, kv, P, x] (the [layers, pages, kv, P, x] pool split by layer): each layer
  # writes its own buffer in place, where a scatter into one stacked array inside the decode
  # loop may copy the whole pool on XLA:CPU (as `fused_decode.unstack_cache` found for caches).
  k: tuple
  v: tuple
  # The keys' and values' dtype where k / v hold their uint16 bits (`init_pool` stores a 16-bit
  # float pool so: XLA:CPU scatters bfloat16 through a float32 copy of the whole pool); None:
  # the arrays' own.
  dtype: Any = dataclasses.field(default=None, metadata=dict(static=True))

  @property
  def page_size(self) -> int:
    return self.k[0].shape[2]

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in self.k + self.v)


def init_pool(config: LlmConfig, num_pages: int, page_size: int, dtype=jnp.float32) -> PagePool:
  shape = (num_pages, config.num_kv_heads, page_size, config.head_dim)
  layers = range(config.num_layers)
  dtype = jnp.dtype(dtype)
  stored = jnp.uint16 if dtype.itemsize == 2 else dtype
  return PagePool(k=tuple(jnp.zeros(shape, stored) for _ in layers),
                  v=tuple(jnp.zeros(shape, stored) for _ in layers),
                  dtype=dtype if stored == jnp.uint16 else None)


def _bits(a):
  return jax.lax.bitcast_convert_type(a, jnp.uint16)


def write_pages(layer, where, new, dtype):
  """`layer` [pages, kv, P, x] (a `PagePool`'s, of keys or values of `dtype`) with `new` [b, t,
  kv, x] written at `where` (page [b, t], offset [b, t]: advanced indices around the kv-head
  slice). A uint16 layer holds its 16-bit floats' bits and takes new's bits: XLA:CPU scatters
  bfloat16 by converting the whole layer to float32 and back, four passes over every page for
  each token (Qwen2.5-Coder-1.5B's decode call spent 6 of its 6.9 s there), and a bitcast of
  the whole layer is a copy too; an integer scatter writes in place."""
  page, offset = where
  new = new.astype(dtype or layer.dtype)
  return layer.at[page, :, offset].set(_bits(new) if layer.dtype == jnp.uint16 else new)


def read_pages(block, dtype):
  """Gathered pages of a `PagePool` layer as float32 (a uint16 layer holds `dtype`'s bits)."""
  if block.dtype == jnp.uint16:
    block = jax.lax.bitcast_convert_type(block, dtype)
  return block.astype(jnp.float32)


def page_bytes(config: LlmConfig, page_size: int, dtype) -> int:
  """Bytes of one page of k and v over all layers."""
  return (2 * config.num_layers * config.num_kv_heads * page_size * config.head_dim
          * jnp.dtype(dtype).itemsize)


class PagedRows(NamedTuple):
  """Where each row's tokens of one pass go and what they see.

  pages: [b, max_pages] int32, the rows' page tables (TRASH_PAGE where unused).
  start: [b] int32, position of the pass's first token (the row's tokens in the pool so far).
  count: [b] int32, real tokens of the pass (the rest are padding: written to the trash page,
    their outputs unused); 0 for an idle row.
  """

  pages: jax.Array
  start: jax.Array
  count: jax.Array


def paged_attention(q, pool_k, pool_v, pages, q_pos, kv_len, block_pages: int, dtype=None):
  """q [b, t, h, x] at positions q_pos [b, t] over the keys at positions < kv_len [b] (and <=
  the query's own) in one layer's pages pool_k / pool_v [pages, kv, P, x]: [b, t, h, x] f32.

  A pass of a few queries a row (decode) runs the C++ kernel on a CPU backend where it is built
  (`cpu_attention`); everything else, and every other platform, runs `paged_attention_loop`.
  dtype: the keys' and values' dtype where the pools hold their bits (uint16); None: the
  pools' own."""
  loop = functools.partial(paged_attention_loop, block_pages=block_pages, dtype=dtype)
  args = (q, pool_k, pool_v, pages, q_pos, kv_len)
  if not cpu_attention.takes(q, pool_k, dtype):
    return loop(*args)
  kernel = functools.partial(cpu_attention.attend, dtype=dtype)
  return jax.lax.platform_dependent(*args, cpu=kernel, default=loop)


def paged_attention_loop(q, pool_k, pool_v, pages, q_pos, kv_len, block_pages: int,
                         dtype=None):
  """`paged_attention` in plain JAX (the kernel's reference): a loop over blocks of
  `block_pages` pages of the page table, up to the longest row, with the running max / sum /
  output of an online softmax; each block is gathered through the table
  ([b, block_pages, kv, P, x]) and read once. A row that sees no key (idle) gets zeros."""
  b, t, h, x = q.shape
  kvh, psize = pool_k.shape[1], pool_k.shape[2]
  g = h // kvh
  n_pages = pages.shape[1]
  bp = min(block_pages, n_pages)
  if n_pages % bp:  # whole blocks: the padding entries point at the trash page, masked by kv_len
    pages = jnp.pad(pages, ((0, 0), (0, bp - n_pages % bp)), constant_values=TRASH_PAGE)
  qg = (q.astype(jnp.float32) * (x ** -0.5)).reshape(b, t, kvh, g, x)
  slots = bp * psize
  n_blocks = -(-jnp.max(kv_len) // slots)  # read only up to the longest row's filled slots

  def body(j, carry):
    m, l, acc = carry
    blk = jax.lax.dynamic_slice_in_dim(pages, j * bp, bp, axis=1)  # [b, bp]
    kb = read_pages(pool_k[blk], dtype)  # [b, bp, kv, P, x]
    vb = read_pages(pool_v[blk], dtype)
    k_pos = j * slots + jnp.arange(slots).reshape(bp, psize)  # [bp, P]
    filled = k_pos[None] < kv_len[:, None, None]  # [b, bp, P]
    # A page's unfilled slots hold whatever its last row left (or the trash page's writes):
    # zeroed, so that not even a NaN there reaches this row through p * v.
    vb = jnp.where(filled[:, :, None, :, None], vb, 0.0)
    ok = (k_pos[None, None] <= q_pos[:, :, None, None]) & filled[:, None]  # [b, t, bp, P]
    ok = ok[:, :, None, None]  # [b, t, 1, 1, bp, P]
    sc = jnp.einsum("btkgx,bnkpx->btkgnp", qg, kb)
    sc = jnp.where(ok, sc, _NEG)
    m_new = jnp.maximum(m, jnp.max(sc, axis=(-2, -1)))
    p = jnp.where(ok, jnp.exp(sc - m_new[..., None, None]), 0.0)
    scale = jnp.exp(m - m_new)
    pv = jnp.einsum("btkgnp,bnkpx->btkgx", p, vb)
    return m_new, l * scale + jnp.sum(p, axis=(-2, -1)), acc * scale[..., None] + pv

  init = (jnp.full((b, t, kvh, g), _NEG, jnp.float32), jnp.zeros((b, t, kvh, g), jnp.float32),
          jnp.zeros((b, t, kvh, g, x), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  out = acc / jnp.where(l > 0, l, 1.0)[..., None]
  return out.reshape(b, t, h, x)


def _layer(x, lp, lora, adapter, project, config: LlmConfig, cos, sin, pool: PagePool, i: int,
           where, rows: PagedRows, q_pos, block_pages: int):
  """`model.layer` over pages: this pass's k and v written at `where` (pages, offsets), then
  attention over the row's pages up to the pass's end."""
  b, t, _ = x.shape
  h = model.rms_norm(x, lp.attn_norm, config.rms_norm_eps)
  q, k, v = project.qkv(h, lp, lora, adapter, config)
  q = q.reshape(b, t, config.num_heads, config.head_dim)
  k = k.reshape(b, t, config.num_kv_heads, config.head_dim)
  v = v.reshape(b, t, config.num_kv_heads, config.head_dim)
  if config.qk_norm:
    q = model.rms_norm(q, lp.q_norm, config.rms_norm_eps)
    k = model.rms_norm(k, lp.k_norm, config.rms_norm_eps)
  q, k = model._apply_rope(q, cos, sin), model._apply_rope(k, cos, sin)
  k_l, v_l = (write_pages(pool.k[i], where, k, pool.dtype),
              write_pages(pool.v[i], where, v, pool.dtype))
  swap = lambda layers, new: layers[:i] + (new,) + layers[i + 1:]
  pool = PagePool(k=swap(pool.k, k_l), v=swap(pool.v, v_l), dtype=pool.dtype)
  a = paged_attention(q, k_l, v_l, rows.pages, q_pos, rows.start + rows.count, block_pages,
                      pool.dtype)
  a = a.astype(x.dtype).reshape(b, t, config.q_size)
  x = x + project.o(a, lp, lora, adapter)
  h = model.rms_norm(x, lp.mlp_norm, config.rms_norm_eps)
  gate, up = project.gate_up(h, lp, lora, adapter)
  x = x + project.down(jax.nn.silu(gate) * up, lp, lora, adapter)
  return x, pool


def forward_paged(params: Params, config: LlmConfig, tokens, rows: PagedRows, pool: PagePool, *,
                  adapter=None, fused=None, block_pages: int = 16, rope=None, image=None,
                  embed_bits=None):
  """tokens [b, t] (each row's `rows.count` real tokens first) through the decoder over pages;
  (logits [b, v] float32 at each row's last real token, the pool with this pass's k and v).

  fused: `fused_decode.decode_layers(params.layers)` (made once by the engine: the CPU layout),
    or None to read the stored stacked layers. Layers run in a Python loop, each writing its
    layer of the pool, as `fused_decode.run_layers` does.
  rope: the rotary positions, [b, t] or Qwen2.5-VL's three streams [b, 3, t]; None: the slots
    (a text model's). The slots still say where k / v go and what each query sees.
  image: (features [b, t, d], is_image [b, t] bool): the vision tower's tokens replacing the
    image pad tokens' embeddings.
  embed_bits: `model.bits_view(params).embed` (a 16-bit embedding as uint16, made outside jit),
    gathered instead of the embedding: XLA:CPU gathers a bfloat16 table through a float32 copy
    of all of it (Qwen2.5-Coder-1.5B's 467 MB, 934 MB written at every decode call)."""
  b, t = tokens.shape
  psize = pool.page_size
  idx = jnp.arange(t)
  positions = rows.start[:, None] + idx  # [b, t]
  real = idx[None, :] < rows.count[:, None]
  entry = jnp.clip(positions // psize, 0, rows.pages.shape[1] - 1)
  page = jnp.where(real, jnp.take_along_axis(rows.pages, entry, axis=1), TRASH_PAGE)
  where = (page, positions % psize)
  rope = positions if rope is None else rope if rope.ndim == 2 else jnp.moveaxis(rope, 1, 0)
  cos, sin = model._rope_tables(rope, config)
  if embed_bits is None:
    x = jnp.take(params.embed, tokens, axis=0)
  else:
    x = model._from_bits(jnp.take(embed_bits, tokens, axis=0), params.embed)
  if image is not None:
    features, is_image = image
    x = jnp.where(is_image[..., None], features.astype(x.dtype), x)
  for i in range(config.num_layers):
    if fused is None:  # the stack's layer i (the CPU decode kernel reads it in place)
      lp, project = jax.tree.map(lambda a: a[i], params.layers), model.StackedProjections(
          params.layers, i)
    else:
      lp, project = fused[i], fused_decode.FUSED
    lora = None if adapter is None else adapter.for_layer(i)
    x, pool = _layer(x, lp, lora, adapter, project, config, cos, sin, pool, i, where, rows,
                     positions, block_pages)
  last = jnp.clip(rows.count - 1, 0, t - 1)
  x = jnp.take_along_axis(x, last[:, None, None], axis=1)  # [b, 1, d]
  x = model.rms_norm(x, params.final_norm, config.rms_norm_eps)
  return model.head_logits(x, model.head_of(params))[:, 0], pool
