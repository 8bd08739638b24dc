"""Batched generation from Qwen2.5-VL prompts with images: `sample`.

The images of every row go through the vision tower once; the prompts are left-padded and
bucketed by `sampling.sample`, whose prefill takes their image inputs (`vl.ImageRows`: each
row's tower tokens for its image pads, its [3, t] rotary streams). Its decode loop then runs
unchanged: each row's cache continues from its own largest position + 1, so a row after a
448 x 448 image decodes 240 positions behind its token count, a text row from its length.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from morse_jax.llm import vision
from morse_jax.llm import vl
from morse_jax.llm.sampling import GenerationSettings, SampleOutput
from morse_jax.llm.sampling import sample as sample_text


def pixels_of(config: vl.VlConfig, images: Sequence[Sequence[np.ndarray]]):
  """Every row's normalised [3, H, W] images (`vision.normalize`), row after row ->
  (pixel_values [n, patch_dim] or None, grids, each row's image pad tokens)."""
  pixels, grids, pads = [], [], []
  for row in images:
    patched = [vision.patchify(image, config.vision) for image in row]
    pixels += [p for p, _ in patched]
    grids += [g for _, g in patched]
    pads.append(sum(config.image_tokens(g) for _, g in patched))
  return (np.concatenate(pixels) if pixels else None), grids, pads


def check_image_runs(config: vl.VlConfig, prompts: Sequence[Sequence[int]],
                     pads: Sequence[int]):
  """Each prompt must hold exactly its images' image pad tokens (ValueError naming the row)."""
  if len(pads) != len(prompts):
    raise ValueError(f"images: {len(pads)} rows of images for {len(prompts)} prompts")
  for i, (prompt, want) in enumerate(zip(prompts, pads)):
    have = int(np.sum(np.asarray(prompt) == config.image_token_id))
    if have != want:
      raise ValueError(f"prompt {i}: {have} image pad tokens, its images take {want}")


def sample(model: vl.VlModel, prompts: Sequence[Sequence[int]],
           images: Sequence[Sequence[np.ndarray]], settings: GenerationSettings, *, rng,
           adapter=None, row_keys=None, mesh=None, rules=None) -> SampleOutput:
  """`sampling.sample` for prompts with images.

  prompts: token ids, each image as `config.image_tokens(grid)` image pad tokens (between the
    vision start / end tokens, as `apex_jax.agents.vision_chat.qwen_vl_text` renders them).
  images: per prompt its normalised [3, H, W] images in order (`vision.normalize`); an empty
    sequence for a text row. settings, rng, adapter, row_keys, mesh, rules: as `sampling.sample`
    (the adapter is the language model's LoRA experts, the tower has none; over a mesh, pass
    the language model's params placed with `sharding.shard_params`: the tower runs where its
    params are, its tokens are then placed with the rows)."""
  pixels, grids, pads = pixels_of(model.config, images)
  check_image_runs(model.config, prompts, pads)
  params, config = model.params, model.config
  features = vl.image_features(params, config, pixels, grids) if grids else None

  def inputs(tokens, mask):
    return vl.image_rows(params, config, tokens, grids, features, mask)

  return sample_text(model.text, prompts, settings, rng=rng, adapter=adapter, row_keys=row_keys,
                     mesh=mesh, rules=rules, image_rows=inputs)
