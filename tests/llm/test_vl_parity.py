"""Qwen2.5-VL parity with transformers (PyTorch, CPU) on a tiny random model that the test writes:
the vision tower, the logits of text-only, one-image, two-image and second-turn prompts, greedy
tokens (whole passes and one prefill + cache), loading and refusals."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax.llm import vision, vl
from tests import tiny_models

TOKENS = tiny_models.VL_TOKENS
IMAGE, START, END = (TOKENS["image_token_id"], TOKENS["vision_start_token_id"],
                     TOKENS["vision_end_token_id"])


@pytest.fixture(scope="module")
def vl_model(vl_folder):
  folder, torch_model = vl_folder
  return vl.load(folder), torch_model


def image(seed, height, width):
  """A normalised image [3, H, W], as the processor's rescale + normalise would give."""
  return np.random.RandomState(seed).randn(3, height, width).astype(np.float32)


def images_in(config, *shapes):
  pixels, grids = zip(*(vision.patchify(image(i, h, w), config.vision)
                        for i, (h, w) in enumerate(shapes)))
  return np.concatenate(pixels), list(grids)


def text(seed, n):
  return list(np.random.RandomState(seed).randint(5, 100, n))


def image_run(config, grid):
  """The processor's layout: <|vision_start|>, one <|image_pad|> per merged token, <|vision_end|>."""
  return [START] + [IMAGE] * config.image_tokens(grid) + [END]


def torch_logits(model, ids, pixels=None, grids=None, mask=None):
  kwargs = {}
  if pixels is not None:
    kwargs.update(pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grids),
                  mm_token_type_ids=torch.tensor((np.asarray(ids) == IMAGE).astype(np.int64)))
  if mask is not None:
    kwargs["attention_mask"] = torch.tensor(mask)
  with torch.no_grad():
    return model(torch.tensor(np.asarray(ids), dtype=torch.long), **kwargs).logits.numpy()


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("shapes", [
    [(448, 448)],  # the static path: 1024 patches, 16 windows of 64, 256 merged tokens
    [(112, 168)],  # uneven windows (4 x 6 merged: windows of 16 and 8 merged tokens)
    [(56, 84), (112, 112)],  # two images of different sizes in one call
])
def test_vision_tower_matches_transformers(vl_model, shapes):
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, *shapes)
  with torch.no_grad():
    ref = ref_model.model.visual(torch.tensor(pixels), torch.tensor(grids)).pooler_output.numpy()
  ours = vl.image_features(model.params, model.config, pixels, grids)
  assert ours.shape == ref.shape
  print(f"vision tower {shapes}: max |diff| {max_diff(ours, ref):.2e}")
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


def test_448_layout_is_16_windows_of_64(vl_model):
  model, _ = vl_model
  lay = vision.layout([(1, 32, 32)], model.config.vision)
  assert lay.windows == (64,) * 16 and lay.images == (1024,)
  assert model.config.image_tokens((1, 32, 32)) == 256


def test_patchify_matches_the_processor(vl_model):
  model, _ = vl_model
  try:
    from transformers import Qwen2VLImageProcessor
    processor = Qwen2VLImageProcessor()
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"transformers' image processor unavailable offline: {e}")
  img = image(3, 56, 84)
  out = processor(images=[img], do_resize=False, do_rescale=False, do_normalize=False,
                  input_data_format="channels_first", return_tensors="np")
  pixels, grid = vision.patchify(img, model.config.vision)
  assert list(out["image_grid_thw"][0]) == list(grid)
  np.testing.assert_allclose(out["pixel_values"], pixels, atol=1e-6)


def test_text_only_logits_match_transformers(vl_model):
  model, ref_model = vl_model
  ids = np.array([text(0, 19), text(1, 19)])
  ref = torch_logits(ref_model, ids)
  ours, _ = vl.forward(model.params, model.config, ids)
  print(f"text only: max |diff| {max_diff(ours, ref):.2e}")
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shapes", [[(112, 168)], [(56, 84), (112, 112)]])
def test_image_prompt_logits_match_transformers(vl_model, shapes):
  """One image, two images: mrope positions, the pad tokens replaced, text after each image."""
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, *shapes)
  ids = text(0, 5)
  for i, grid in enumerate(grids):
    ids += image_run(model.config, grid) + text(i + 1, 4)
  ids = np.array([ids])
  ref = torch_logits(ref_model, ids, pixels, grids)
  ours, _ = vl.forward(model.params, model.config, ids, pixels, grids)
  print(f"images {shapes}: max |diff| {max_diff(ours, ref):.2e}")
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


def test_image_in_the_second_turn_matches_transformers(vl_model):
  """A first turn of text only, then a turn with an image (as a tool's result would come)."""
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, (84, 56))
  ids = np.array([text(0, 12) + text(1, 3) + image_run(model.config, grids[0]) + text(2, 6)])
  ref = torch_logits(ref_model, ids, pixels, grids)
  ours, _ = vl.forward(model.params, model.config, ids, pixels, grids)
  print(f"second turn: max |diff| {max_diff(ours, ref):.2e}")
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


def test_batch_of_rows_with_and_without_images_left_padded(vl_model):
  """Two rows, the first with an image, the second text only and left-padded: each row's
  positions its own."""
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, (56, 56))
  row0 = text(0, 3) + image_run(model.config, grids[0]) + text(1, 4)
  row1 = text(2, len(row0) - 5)
  ids = np.array([row0, [0] * 5 + row1])
  mask = np.ones_like(ids)
  mask[1, :5] = 0
  ref = torch_logits(ref_model, ids, pixels, grids, mask)
  ours, _ = vl.forward(model.params, model.config, ids, pixels, grids, attention_mask=mask)
  real = mask.astype(bool)
  print(f"padded batch: max |diff| {max_diff(np.asarray(ours)[real], ref[real]):.2e}")
  np.testing.assert_allclose(np.asarray(ours)[real], ref[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("use_cache", [False, True])
def test_greedy_tokens_match_transformers(vl_model, use_cache):
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, (112, 112), (56, 84))
  ids = text(0, 4) + image_run(model.config, grids[0]) + text(1, 3)
  ids = np.array([ids + image_run(model.config, grids[1]) + text(2, 3)])
  steps = 5
  with torch.no_grad():
    ref = ref_model.generate(
        torch.tensor(ids), pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grids),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)), do_sample=False,
        max_new_tokens=steps, min_new_tokens=steps)[:, ids.shape[1]:].numpy()
  ours = vl.greedy(model.params, model.config, ids, pixels, grids, steps=steps,
                   use_cache=use_cache)
  np.testing.assert_array_equal(ours, ref)


def left_padded_generate(ref_model, rows, pixels, grids, steps):
  """(ids, mask, transformers' `generate` greedy tokens [b, steps]) of rows left-padded with 0."""
  t = max(len(r) for r in rows)
  ids = np.array([[0] * (t - len(r)) + r for r in rows])
  mask = np.array([[0] * (t - len(r)) + [1] * len(r) for r in rows])
  with torch.no_grad():
    ref = ref_model.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pixels),
        image_grid_thw=torch.tensor(grids),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)), do_sample=False,
        max_new_tokens=steps, min_new_tokens=steps, pad_token_id=0)[:, t:].numpy()
  return ids, mask, ref


# without the cache (a full forward a token: ~13 s) only in the slow run; the cached path is
# the one generation takes
@pytest.mark.parametrize("use_cache", [pytest.param(False, marks=pytest.mark.slow), True])
def test_greedy_batch_rows_with_their_own_image_offsets(vl_model, use_cache):
  """Three left-padded rows: a 448 x 448 image (offset 256 - 16 = 240 tokens back), a small one,
  text only; each row decodes from its own largest position, as transformers' `generate`."""
  model, ref_model = vl_model
  pixels, grids = images_in(model.config, (448, 448), (56, 84))
  rows = [text(0, 2) + image_run(model.config, grids[0]) + text(1, 3),
          text(2, 5) + image_run(model.config, grids[1]) + text(3, 2), text(4, 9)]
  steps = 4
  ids, mask, ref = left_padded_generate(ref_model, rows, pixels, grids, steps)
  _, deltas = vl.rope_index(ids, model.config, grids, mask)
  assert deltas[0] < deltas[1] < 0 and deltas[2] == 0
  ours = vl.greedy(model.params, model.config, ids, pixels, grids, steps=steps,
                   use_cache=use_cache, attention_mask=mask)
  np.testing.assert_array_equal(ours, ref)


def test_refuses_an_image_size_the_tower_does_not_take(vl_model):
  model, _ = vl_model
  with pytest.raises(ValueError, match="450 x 448 px"):
    vision.patchify(image(0, 450, 448), model.config.vision)
  with pytest.raises(ValueError, match="multiples of 28 px"):
    vision.check_image_size(448, 100, model.config.vision)


def test_refuses_pad_tokens_that_do_not_match_the_images(vl_model):
  model, _ = vl_model
  pixels, grids = images_in(model.config, (56, 56))
  ids = np.array([text(0, 3) + [START] + [IMAGE] * 3 + [END]])
  with pytest.raises(ValueError, match="3 image pad tokens"):
    vl.forward(model.params, model.config, ids, pixels, grids)


def test_config_reads_both_layouts(vl_model):
  model, ref_model = vl_model
  nested = ref_model.config.to_dict()
  flat = {**{k: v for k, v in nested.items() if k != "text_config"}, **nested["text_config"],
          "model_type": "qwen2_5_vl"}
  flat["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
  flat.pop("rope_parameters", None)
  flat["rope_theta"] = 10000.0
  assert vl.VlConfig.from_hf_dict(flat) == model.config
  assert model.config.text.mrope_section == (2, 3, 3)


def test_7b_tower_shapes_at_448():
  """Qwen2.5-VL-7B's tower traced (no weights allocated): 448 x 448 -> 256 tokens of 3584."""
  import jax
  config = vision.QWEN25_VL_7B
  pixels = jax.ShapeDtypeStruct((1024, config.patch_dim), jnp.bfloat16)
  out = jax.eval_shape(lambda p, x: vision.tower(p, config, x, [(1, 32, 32)]),
                       vision.abstract_params(config), pixels)
  assert out.shape == (256, 3584)
  assert vision.layout([(1, 32, 32)], config).windows == (64,) * 16


def test_loads_the_language_model_spelling_and_names_a_missing_tensor(vl_model, tmp_path):
  """Some transformers versions save `model.language_model.*` / `model.visual.*`; both load to
  the same weights. A missing tensor is refused by name."""
  import json
  import os
  import shutil

  import jax
  from safetensors.numpy import load_file, save_file

  from morse_jax.llm import CheckpointError

  model, ref_model = vl_model
  src = str(tmp_path / "src")
  ref_model.save_pretrained(src)
  tensors = load_file(os.path.join(src, "model.safetensors"))
  renamed = {("model.language_model." + k[6:] if k.startswith("model.") else
              "model." + k if k.startswith("visual.") else k): v for k, v in tensors.items()}
  other = str(tmp_path / "other")
  os.makedirs(other)
  shutil.copy(os.path.join(src, "config.json"), other)
  save_file(renamed, os.path.join(other, "model.safetensors"), metadata={"format": "pt"})
  loaded = vl.load(other)
  for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  del renamed["model.visual.merger.ln_q.weight"]
  save_file(renamed, os.path.join(other, "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(CheckpointError, match="visual.merger.ln_q.weight"):
    vl.load(other)
  assert json.load(open(os.path.join(other, "config.json")))["model_type"] == "qwen2_5_vl"
