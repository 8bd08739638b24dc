"""Update rows with images (Qwen2.5-VL): `with_images` gives a `PolicyBatch` the image inputs
its prompts' images make (`vl.ImageRows`), computed once, outside the gradient.

The vision tower is frozen: its tokens are computed here, before the step, and held under
`stop_gradient`, so the step's gradient reaches the LoRA experts on the language model only (the
tower has no experts and gets no gradient, tested). The step then embeds each row with its image
tokens in place and runs the decoder on its [3, T] rotary streams (`logprobs.token_logprobs`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from morse_jax.llm import vl
from morse_jax.llm.vl_sampling import check_image_runs, pixels_of
from morse_jax.rl.batch import PolicyBatch


def image_inputs(params: vl.VlParams, config: vl.VlConfig, tokens, attention_mask,
                 images: Sequence[Sequence[np.ndarray]]) -> vl.ImageRows:
  """The `vl.ImageRows` of rows (any padding, as `attention_mask` says) whose image pad tokens
  stand for `images` (per row its normalised [3, H, W] images; rows past the list, the batch's
  padding rows, have none); the tower's tokens carry no gradient."""
  tokens = np.asarray(tokens)
  if len(images) > tokens.shape[0]:
    raise ValueError(f"image_inputs: images for {len(images)} rows, the batch has "
                     f"{tokens.shape[0]}")
  rows = list(images) + [[]] * (tokens.shape[0] - len(images))
  pixels, grids, pads = pixels_of(config, rows)
  check_image_runs(config, tokens, pads)
  features = None
  if grids:
    features = jax.lax.stop_gradient(vl.image_features(params, config, pixels, grids))
  return vl.image_rows(params, config, tokens, grids, features, np.asarray(attention_mask))


def with_images(batch: PolicyBatch, model: vl.VlModel,
                images: Sequence[Sequence[np.ndarray]]) -> PolicyBatch:
  """`batch` (rows packed from Qwen2.5-VL prompts with image pads) with its image inputs set;
  the update's backbone is then `model.params.text`, its config `model.config.text`."""
  return dataclasses.replace(batch, images=image_inputs(model.params, model.config, batch.tokens,
                                                        batch.attention_mask, images))
