"""Qwen2.5-VL requests on the engine: a row's images, rotary streams and tower tokens.

A request's images are checked and patchified at submission (`prepare`), with its prompt's three
rotary streams and its rope delta (`vl.rope_index`: text after an image goes on from the image's
largest position, so a row decodes at slot + delta). The tower runs once per request, at its
first prefill chunk (`ensure_features`), and its tokens stay on the host: each chunk takes the
ones its image pad tokens need (`chunk_inputs`), so a chunk may cut an image anywhere and the
prefill programs keep their [rows, chunk] shapes whatever the images.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from morse_jax.llm import vision, vl


@dataclasses.dataclass
class RowImages:
  """One request's image inputs (a text request on a VL engine has none but its streams)."""

  pixels: np.ndarray | None  # [n, patch_dim] all its images (`vision.patchify`), or None
  grids: list  # each image's (1, h, w)
  streams: np.ndarray  # [3, p] int32 rotary positions of the prompt
  delta: int  # largest position + 1 - prompt length: decode position = slot + delta
  slot: np.ndarray  # [p] int32 each image pad token's index into the features; -1 elsewhere
  features: np.ndarray | None = None  # [k, d] the tower's tokens, at the first prefill


def prepare(model: vl.VlModel, prompt: np.ndarray, images: Sequence[np.ndarray]) -> RowImages:
  """A request's `RowImages`; ValueError naming `Request.images` for a bad image or a prompt
  whose image pad tokens do not match its images."""
  config = model.config
  patched = []
  for i, image in enumerate(images):
    shape = np.shape(image)
    if len(shape) != 3 or shape[0] != 3:
      raise ValueError(f"Request.images[{i}]: a normalised [3, H, W] image is needed "
                       f"(`vision.normalize`), got shape {shape}")
    try:
      patched.append(vision.patchify(np.asarray(image, np.float32), config.vision))
    except ValueError as e:
      raise ValueError(f"Request.images[{i}]: {e}") from None
  grids = [g for _, g in patched]
  is_image = prompt == config.image_token_id
  want = sum(config.image_tokens(g) for g in grids)
  if int(is_image.sum()) != want:
    raise ValueError(f"Request.images: the prompt has {int(is_image.sum())} image pad tokens, "
                     f"its {len(grids)} images take {want}")
  try:
    streams, delta = vl.rope_index(prompt[None], config, grids)
  except ValueError as e:
    raise ValueError(f"Request.images: {e}") from None
  slot = np.where(is_image, np.cumsum(is_image) - 1, -1).astype(np.int32)
  pixels = np.concatenate([p for p, _ in patched]) if patched else None
  return RowImages(pixels, grids, streams[:, 0], int(delta[0]), slot)


def ensure_features(model: vl.VlModel, images: RowImages) -> None:
  """The tower's tokens of a request's images (once; nothing for a text request)."""
  if images.grids and images.features is None:
    out = vl.image_features(model.params, model.config, images.pixels, images.grids)
    images.features = np.asarray(out, np.float32)


def chunk_inputs(rows: Sequence[tuple[RowImages, int, int]], r: int, t: int, width: int):
  """The prefill chunk's `rope` [r, 3, t] and `image` ((features [r, t, width], is_image
  [r, t]) or None when no row's chunk holds an image token) for rows given as (images, first
  prompt token of the chunk, tokens in it); padding rows and tokens at position 0."""
  rope = np.zeros((r, 3, t), np.int32)
  is_image = np.zeros((r, t), bool)
  for i, (images, start, count) in enumerate(rows):
    rope[i, :, :count] = images.streams[:, start:start + count]
    is_image[i, :count] = images.slot[start:start + count] >= 0
  if not is_image.any():
    return rope, None
  features = np.zeros((r, t, width), np.float32)
  for i, (images, start, count) in enumerate(rows):
    slots = images.slot[start:start + count]
    if is_image[i].any():
      features[i, :count][slots >= 0] = images.features[slots[slots >= 0]]
  return rope, (features, is_image)
