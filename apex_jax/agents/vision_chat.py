"""A chat with images (`Conversation.messages` + `.images`: one `<image>` marker per image) in
the two forms a vision-language backbone takes:

- `qwen_vl_text`: Qwen2.5-VL's chat template as text, each marker replaced by
  `<|vision_start|>` + N x `<|image_pad|>` + `<|vision_end|>` (N = 256 for a 448 x 448 image:
  1024 patches of 14 px, 2 x 2 merged), the processor's expansion already done, so the tokens
  feed `morse_jax.llm.vl.forward` (its `rope_index` finds each image by the pad token after
  the vision start) with the images in the order of their markers; `qwen_vl_ids` the same
  chat as token ids (control tokens by id, text through the tokenizer's sanitising encode).
- `openai_messages`: OpenAI chat messages whose content parts are text and `image_url` parts
  with PNG data URLs, split at the markers, as the authors' inference client builds them
  (Serve/Train_Planner/call_agent.py `create_multimodal_message`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from apex_jax.agents.conversation import markers
from apex_jax.tools import images as images_lib

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_SPECIAL = (IM_START, IM_END, VISION_START, IMAGE_PAD, VISION_END)
# Qwen2.5-VL's template opens a chat that has no system message with this one
DEFAULT_SYSTEM = "You are a helpful assistant."


def image_tokens(size: int = images_lib.IMAGE_SIZE, patch: int = 14, merge: int = 2) -> int:
  """Language-model tokens of one size x size image: (size / patch)^2 patches / merge^2."""
  if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % (patch * merge):
    raise ValueError(f"image size {size!r} is not a positive multiple of patch {patch} x merge "
                     f"{merge}")
  return (size // patch) ** 2 // merge ** 2


def _check(messages: Sequence[dict], images: Sequence) -> None:
  if markers(messages) != len(images):
    raise ValueError(f"{len(images)} image(s) for {markers(messages)} {images_lib.MARKER} "
                     f"marker(s) in the messages")


def _pieces(messages: Sequence[dict], add_generation_prompt: bool):
  """Qwen2.5-VL's chat template as ("special", spelling) / ("text", str) / ("image", None)
  pieces, in order: one definition for the text and the token form."""
  if not messages or messages[0]["role"] != "system":
    yield from (("special", IM_START), ("text", f"system\n{DEFAULT_SYSTEM}"),
                ("special", IM_END), ("text", "\n"))
  for m in messages:
    yield "special", IM_START
    pieces = f"{m['role']}\n{m['content']}".split(images_lib.MARKER)
    for i, piece in enumerate(pieces):
      if i:
        yield "image", None
      if piece:
        yield "text", piece
    yield from (("special", IM_END), ("text", "\n"))
  if add_generation_prompt:
    yield from (("special", IM_START), ("text", "assistant\n"))


def qwen_vl_text(messages: Sequence[dict], images: Sequence = (), *,
                 add_generation_prompt: bool = True, tokens_per_image: int | None = None) -> str:
  """The chat as Qwen2.5-VL's template renders it, image pads expanded (see the module doc).
  `images` only fixes the count (one per marker); tokens_per_image defaults to 448 x 448's."""
  _check(messages, images)
  n = image_tokens() if tokens_per_image is None else tokens_per_image
  block = VISION_START + IMAGE_PAD * n + VISION_END
  return "".join(block if kind == "image" else piece
                 for kind, piece in _pieces(messages, add_generation_prompt))


def qwen_vl_ids(tokenizer, messages: Sequence[dict], images: int = 0, *,
                add_generation_prompt: bool = True,
                tokens_per_image: int | None = None) -> list[int]:
  """`qwen_vl_text`'s chat as token ids: the template's markers and each image's block by their
  ids, every text piece through `tokenizer.encode` (so text never becomes a control token).
  images: how many `<image>` markers stand for images (all or none; with none a marker stays
  text: a chat that only quotes a question, as the planner's)."""
  if images and markers(messages) != images:
    raise ValueError(f"{images} image(s) for {markers(messages)} {images_lib.MARKER} "
                     f"marker(s) in the messages")
  n = image_tokens() if tokens_per_image is None else tokens_per_image
  ids = special_ids(tokenizer)
  block = [ids[VISION_START]] + [ids[IMAGE_PAD]] * n + [ids[VISION_END]]
  out = []
  for kind, piece in _pieces(messages, add_generation_prompt):
    if kind == "image":
      out += block if images else tokenizer.encode(images_lib.MARKER)
    else:
      out += [ids[piece]] if kind == "special" else tokenizer.encode(piece)
  return out


def special_ids(tokenizer) -> dict[str, int]:
  """The ids of the template's control tokens in a Qwen2.5-VL tokenizer (`llm.Tokenizer`);
  ValueError naming a spelling the vocabulary lacks."""
  vocab = tokenizer.hf.get_vocab()
  missing = [s for s in _SPECIAL if s not in vocab]
  if missing:
    raise ValueError(f"{tokenizer.path}: the tokenizer lacks Qwen2.5-VL's {missing}")
  return {s: vocab[s] for s in _SPECIAL}


def openai_messages(messages: Sequence[dict], images: Sequence[np.ndarray] = ()) -> list[dict]:
  """The chat as OpenAI messages: a message without markers keeps its text content; one with
  markers becomes parts, text between markers and an `image_url` data URL at each."""
  _check(messages, images)
  out, k = [], 0
  for m in messages:
    pieces = m["content"].split(images_lib.MARKER)
    if len(pieces) == 1:
      out.append({"role": m["role"], "content": m["content"]})
      continue
    parts = []
    for i, piece in enumerate(pieces):
      if piece:
        parts.append({"type": "text", "text": piece})
      if i < len(pieces) - 1:
        parts.append({"type": "image_url",
                      "image_url": {"url": images_lib.to_data_url(images[k])}})
        k += 1
    out.append({"role": m["role"], "content": parts})
  return out
