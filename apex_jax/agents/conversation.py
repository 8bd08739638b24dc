"""A chat kept as token segments: what the policy generated (with its sampling log-probs) and
everything else (prompt, tool output, follow-up user turns; no log-probs, never trained on).

Generated tokens are kept exactly as sampled, never re-tokenised from text. A message appended
after them is tokenised as a delta of the chat template: the ids of [anchor, message] with the
assistant turn opened, minus the ids of [anchor] alone (the way verl's agent loop appends tool
responses). This needs a template whose rendering of a user message is a prefix of its rendering
with more messages after it, which `ChatDeltas` checks once.

Images ride beside the text: a message's text holds one `<image>` marker per image
(`apex_jax.tools.images.MARKER`, as the authors' prompts write it) and `Conversation.images`
holds the decoded images in the order of the markers over the whole chat. A text backbone reads
the markers as text; a VL backbone (a tokenizer that `takes_images`) renders them as image
blocks and takes the images (`agents.vision_chat` renders the chat for
Qwen2.5-VL, or as OpenAI `image_url` parts).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from morse_jax.rl.rollout import Segment

from apex_jax.tools import images as images_lib

_ANCHOR = [{"role": "user", "content": "anchor"}]


class ChatDeltas:
  """Token ids of messages appended to a conversation that is already in token form."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self._base = list(tokenizer.apply_chat_template(_ANCHOR, add_generation_prompt=False))

  def __call__(self, messages: Sequence[dict], images: int = 0) -> list[int]:
    """images: how many markers of `messages` are images (a VL tokenizer's image blocks)."""
    full = chat_ids(self.tokenizer, _ANCHOR + list(messages), images)
    if full[:len(self._base)] != self._base:
      raise ValueError("the chat template does not render a conversation as a prefix of its "
                       "continuation, so appended messages cannot be tokenised as deltas")
    return full[len(self._base):]


@dataclasses.dataclass
class Conversation:
  """messages: the chat as text (for re-rendering and judges); segments: the same as tokens;
  images: uint8 [448, 448, 3] arrays, one per `<image>` marker of the messages, in order."""

  messages: list[dict]
  segments: list[Segment]
  images: list = dataclasses.field(default_factory=list)

  @classmethod
  def start(cls, tokenizer, messages: list[dict], images: Sequence = ()) -> "Conversation":
    images = checked_images(messages, images)
    ids = chat_ids(tokenizer, messages, len(images))
    return cls(list(messages), [Segment(ids)], images)

  def tokens(self) -> list[int]:
    return [int(t) for s in self.segments for t in s.tokens]

  def __len__(self) -> int:
    return sum(len(s.tokens) for s in self.segments)

  def add_generated(self, generation) -> None:
    tokens = np.asarray(generation.tokens, np.int32)
    self.segments.append(Segment(tokens, np.asarray(generation.logprobs, np.float32)))
    self.messages.append({"role": "assistant", "content": generation.text})

  def add_messages(self, deltas: ChatDeltas, messages: Sequence[dict],
                   images: Sequence = ()) -> int:
    """Appends messages (never trained on) and their images (one per marker) and opens the next
    assistant turn; returns tokens."""
    images = checked_images(messages, images)
    ids = deltas(messages, len(images))
    self.segments.append(Segment(ids))
    self.messages.extend(messages)
    self.images.extend(images)
    return len(ids)

  def generated_text(self) -> str:
    return "\n".join(m["content"] for m in self.messages if m["role"] == "assistant")


def chat_ids(tokenizer, messages: Sequence[dict], images: int = 0) -> list[int]:
  """The chat's ids with the assistant turn opened; a tokenizer that `takes_images`
  (`vl_generator.VlChatTokenizer`) renders the markers as `images` image blocks, any other reads
  them as text."""
  if getattr(tokenizer, "takes_images", False):
    return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                              images=images))
  return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))


def markers(messages: Sequence[dict]) -> int:
  """How many `<image>` markers the messages' texts hold."""
  return sum(m["content"].count(images_lib.MARKER) for m in messages)


def checked_images(messages: Sequence[dict], images: Sequence) -> list:
  """The images as a list of uint8 [448, 448, 3], one per marker of `messages`, else refused.
  Messages without images may hold markers: a text-only chat (the planner's, which reads
  memories' questions) keeps them as text."""
  images = [images_lib.check_array(x, f"images[{i}]") for i, x in enumerate(images)]
  if images and markers(messages) != len(images):
    raise ValueError(f"{len(images)} image(s) for {markers(messages)} {images_lib.MARKER} "
                     f"marker(s) in the messages")
  return images
