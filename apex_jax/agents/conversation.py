"""A chat kept as token segments: what the policy generated (with its sampling log-probs) and
everything else (prompt, tool output, follow-up user turns; no log-probs, never trained on).

Generated tokens are kept exactly as sampled, never re-tokenised from text. A message appended
after them is tokenised as a delta of the chat template: the ids of [anchor, message] with the
assistant turn opened, minus the ids of [anchor] alone (the way verl's agent loop appends tool
responses). This needs a template whose rendering of a user message is a prefix of its rendering
with more messages after it, which `ChatDeltas` checks once.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from morse_jax.rl.rollout import Segment

_ANCHOR = [{"role": "user", "content": "anchor"}]


class ChatDeltas:
  """Token ids of messages appended to a conversation that is already in token form."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self._base = list(tokenizer.apply_chat_template(_ANCHOR, add_generation_prompt=False))

  def __call__(self, messages: Sequence[dict]) -> list[int]:
    full = list(self.tokenizer.apply_chat_template(_ANCHOR + list(messages),
                                                   add_generation_prompt=True))
    if full[:len(self._base)] != self._base:
      raise ValueError("the chat template does not render a conversation as a prefix of its "
                       "continuation, so appended messages cannot be tokenised as deltas")
    return full[len(self._base):]


@dataclasses.dataclass
class Conversation:
  """messages: the chat as text (for re-rendering and judges); segments: the same as tokens."""

  messages: list[dict]
  segments: list[Segment]

  @classmethod
  def start(cls, tokenizer, messages: list[dict]) -> "Conversation":
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return cls(list(messages), [Segment(ids)])

  def tokens(self) -> list[int]:
    return [int(t) for s in self.segments for t in s.tokens]

  def __len__(self) -> int:
    return sum(len(s.tokens) for s in self.segments)

  def add_generated(self, generation) -> None:
    tokens = np.asarray(generation.tokens, np.int32)
    self.segments.append(Segment(tokens, np.asarray(generation.logprobs, np.float32)))
    self.messages.append({"role": "assistant", "content": generation.text})

  def add_messages(self, deltas: ChatDeltas, messages: Sequence[dict]) -> int:
    """Appends messages (never trained on) and opens the next assistant turn; returns tokens."""
    ids = deltas(messages)
    self.segments.append(Segment(ids))
    self.messages.extend(messages)
    return len(ids)

  def generated_text(self) -> str:
    return "\n".join(m["content"] for m in self.messages if m["role"] == "assistant")
