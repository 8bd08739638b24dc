"""The engine's jitted programs: prefill a chunk, decode k tokens, fork a group's prompt.

Each takes the rows it works on as a gathered batch (`idx`: their slots, padded with the
out-of-range slot S, whose writes are dropped) so it costs what those rows cost, and is compiled
once per power-of-two row count (and, for prefill, chunk length): the engine's slot count sets
how many programs there can be. The pool and the slots' pending logits are donated and updated
in place; everything else about a row (its position, budget, sampling settings, table, route)
the host owns and passes in, so the host never waits on the device to know a row's state.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.paged import PagePool, PagedRows, forward_paged
from morse_jax.llm.params import Params
from morse_jax.llm.row_sampling import choose_rows


class RowSettings(NamedTuple):
  """Per-row decode settings, each [r]: what a request brings."""

  keys: jax.Array  # [r, ...] uint32 PRNG key data (wrapped in the program)
  temperature: jax.Array  # float32
  top_p: jax.Array  # float32
  top_k: jax.Array  # int32
  stops: jax.Array  # [r, n] int32 stop ids, -1 padding
  budget: jax.Array  # int32 tokens the row may generate in all


class Decoded(NamedTuple):
  tokens: jax.Array  # [r, k] int32, -1 after the row stopped (or for idle rows)
  logprobs: jax.Array  # [r, k] float32
  generated: jax.Array  # [r] int32 tokens generated in all after this call
  length: jax.Array  # [r] int32 tokens in the pool after this call
  done: jax.Array  # [r] bool: a stop id or the budget ended the row


@functools.partial(jax.jit, static_argnames=("config", "steps", "block_pages"),
                   donate_argnames=("pool", "pending"))
def decode(params: Params, fused, adapter, pool: PagePool, pending, idx, active, pages, length,
           generated, row: RowSettings, offset=None, embed_bits=None, *, config: LlmConfig,
           steps: int, block_pages: int):
  """Up to `steps` tokens for each active row of `idx` (a while loop that ends when every row
  is done), all on device; (pool, pending, Decoded).

  offset: [r] int32, each row's rotary position less its slot (Qwen2.5-VL's rope delta: text
  after an image goes on from the image's largest position); None: the slot (a text model).
  embed_bits: the embedding as its uint16 bits (`forward_paged`), or None.

  pending: [S, v] float32, each slot's logits for its next token (from prefill or the last
  step). A row emits a token from its logits, then runs it through the decoder for the next
  logits, unless that token ended the row (its k / v is never needed)."""
  r = idx.shape[0]
  row = row._replace(keys=jax.random.wrap_key_data(row.keys))
  logits = pending[jnp.minimum(idx, pending.shape[0] - 1)]
  out_tokens = jnp.full((r, steps), -1, jnp.int32)
  out_logp = jnp.zeros((r, steps), jnp.float32)

  def cond(state):
    step, done = state[0], state[5]
    return (step < steps) & ~jnp.all(done)

  def body(state):
    step, logits, pool, length, generated, done, out_tokens, out_logp = state
    live = ~done
    token, logp = choose_rows(logits, row.keys, generated, row.temperature, row.top_p,
                              row.top_k)
    out_tokens = out_tokens.at[:, step].set(jnp.where(live, token, -1))
    out_logp = out_logp.at[:, step].set(jnp.where(live, logp, 0.0))
    generated = generated + live
    stopped = jnp.any(token[:, None] == row.stops, axis=1) | (generated >= row.budget)
    done = done | (live & stopped)
    count = (~done).astype(jnp.int32)
    new_logits, pool = forward_paged(params, config, token[:, None],
                                     PagedRows(pages, length, count), pool, adapter=adapter,
                                     fused=fused, block_pages=block_pages,
                                     rope=None if offset is None else (length + offset)[:, None],
                                     embed_bits=embed_bits)
    logits = jnp.where(count[:, None] > 0, new_logits, logits)
    return step + 1, logits, pool, length + count, generated, done, out_tokens, out_logp

  state = (jnp.zeros((), jnp.int32), logits, pool, length, generated, ~active, out_tokens,
           out_logp)
  _, logits, pool, length, generated, done, out_tokens, out_logp = jax.lax.while_loop(
      cond, body, state)
  pending = pending.at[idx].set(logits, mode="drop")
  return pool, pending, Decoded(out_tokens, out_logp, generated, length, done & active)


@functools.partial(jax.jit, static_argnames=("config", "block_pages"),
                   donate_argnames=("pool", "pending"))
def prefill(params: Params, fused, adapter, pool: PagePool, pending, idx, tokens, rows: PagedRows,
            last, rope=None, image=None, embed_bits=None, *, config: LlmConfig,
            block_pages: int):
  """One chunk of each row's prompt into its pages; a row whose prompt ends in this chunk
  (`last`) gets its next-token logits in `pending`. (pool, pending). rope, image: the chunk's
  Qwen2.5-VL inputs (`forward_paged`'s); None for a text model."""
  logits, pool = forward_paged(params, config, tokens, rows, pool, adapter=adapter, fused=fused,
                               block_pages=block_pages, rope=rope, image=image,
                               embed_bits=embed_bits)
  target = jnp.where(last, idx, pending.shape[0])  # the others' logits are dropped
  return pool, pending.at[target].set(logits, mode="drop")


@functools.partial(jax.jit, donate_argnames=("pool", "pending"))
def fork(pool: PagePool, pending, src_pages, dst_pages, src_slots, dst_slots):
  """A group member's start: copies of its leader's partly filled last prompt page (the full
  ones are shared) and its leader's pending logits. Padding entries point past the pool / the
  slots and are dropped."""
  copy = lambda a: a.at[dst_pages].set(a[jnp.minimum(src_pages, a.shape[0] - 1)], mode="drop")
  pool = PagePool(k=tuple(map(copy, pool.k)), v=tuple(map(copy, pool.v)),
                  dtype=pool.dtype)
  pending = pending.at[dst_slots].set(pending[jnp.minimum(src_slots, pending.shape[0] - 1)],
                                      mode="drop")
  return pool, pending
