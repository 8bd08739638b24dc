"""The update's forward pass with each group's common prompt run once instead of once per row.

In a B x M rollout the M candidates of a route share their prompt and their experts, and the
prompt is most of each row (the demo: 360-700 prompt tokens, 20-160 generated). `SharedPrefix`
lays a group out as one packed row: the common prefix once, then each member's own suffix. A
block mask lets a suffix see the prefix and itself but not the other suffixes, and its RoPE
positions continue from the prefix, so every token sees exactly the context it had in its own
row. The per-token log-probs are gathered back into the rows' [n, T] layout, so the losses,
masks, advantages and denominators are those of the row layout, untouched.

Built on the host by `compaction.share_prefixes`; run by `logprobs.shared_token_logprobs` (the
step's forward pass when `PolicyBatch.shared` is set).
"""

from __future__ import annotations

import dataclasses

import jax

from morse_jax.lora.mixture import Routes


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SharedPrefix:
  """R packed rows of S slots for the n rows (of T slots) of a PolicyBatch."""

  tokens: jax.Array  # [R, S] a group's common prefix, then each member's suffix
  positions: jax.Array  # [R, S] RoPE positions: a suffix continues from the prefix
  segments: jax.Array  # [R, S] 0 the prefix, k >= 1 the k-th member's suffix, -1 padding
  prev: jax.Array  # [R, S] the slot whose logits predict this token; -1: none (a row's start)
  row: jax.Array  # [n] the packed row holding each row
  col: jax.Array  # [n, T] the packed slot of each row token (0 on padding)
  routes: Routes  # [R] the group's experts
