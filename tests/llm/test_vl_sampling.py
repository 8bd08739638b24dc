"""`vl_sampling.sample`: Qwen2.5-VL prompts with images through the batched sampler, greedy tokens
equal to transformers' `generate` and to `vl.greedy` on the tiny random model; refusals."""

import dataclasses

import jax
import numpy as np
import pytest

from morse_jax.llm import sharding, vision, vl, vl_sampling
from morse_jax.llm.sampling import GREEDY, GenerationSettings, sample
from tests.llm.test_vl_parity import image, image_run, left_padded_generate, text

STEPS = 5


@pytest.fixture(scope="module")
def batch(vl_folder):
  """Three rows, left-padded by the sampler: two images, one image, text only; the reference
  tokens of transformers' `generate` for the same batch."""
  folder, ref_model = vl_folder
  model = vl.load(folder)
  images = [[image(0, 112, 112), image(1, 56, 84)], [image(2, 56, 56)], []]
  pixels, grids, _ = vl_sampling.pixels_of(model.config, images)
  runs = [image_run(model.config, g) for g in grids]
  prompts = [text(0, 4) + runs[0] + text(1, 3) + runs[1] + text(2, 2),
             text(3, 6) + runs[2] + text(4, 5), text(5, 11)]
  ids, mask, ref = left_padded_generate(ref_model, prompts, pixels, grids, STEPS)
  return model, prompts, images, ref, (ids, mask, pixels, grids)


def greedy_sample(model, prompts, images, **settings):
  settings = GenerationSettings(max_new_tokens=STEPS, sampling=GREEDY, **settings)
  return vl_sampling.sample(model, prompts, images, settings, rng=jax.random.key(0))


@pytest.mark.parametrize("prefill_chunk", [512, 16])  # one prefill pass; chunks of 16 tokens
def test_greedy_tokens_match_transformers_and_vl_greedy(batch, prefill_chunk):
  model, prompts, images, ref, (ids, mask, pixels, grids) = batch
  out = greedy_sample(model, prompts, images, prefill_chunk=prefill_chunk)
  np.testing.assert_array_equal(out.tokens, ref)
  assert list(out.lengths) == [STEPS] * 3
  loop = vl.greedy(model.params, model.config, ids, pixels, grids, steps=STEPS,
                   attention_mask=mask)
  np.testing.assert_array_equal(out.tokens, loop)


def test_a_row_decodes_from_its_own_image_offset(batch):
  """Without the image rows' mrope offsets (plain positions for every row) the image rows'
  tokens differ from transformers' on this model; the text row's do not."""
  model, prompts, images, ref, _ = batch
  pixels, grids, _ = vl_sampling.pixels_of(model.config, images)
  features = vl.image_features(model.params, model.config, pixels, grids)

  def plain_positions(tokens, mask):
    images = vl.image_rows(model.params, model.config, tokens, grids, features, mask)
    plain = np.maximum(np.cumsum(mask, 1) - 1, 0)[:, None]
    return dataclasses.replace(images, positions=np.broadcast_to(plain, images.positions.shape))

  out = sample(model.text, prompts, GenerationSettings(max_new_tokens=STEPS, sampling=GREEDY),
               rng=jax.random.key(0), image_rows=plain_positions)
  np.testing.assert_array_equal(out.tokens[2], ref[2])
  assert (out.tokens[:2] != ref[:2]).any()


def test_rows_without_any_image(batch):
  """An all-text batch: no tower run, the same tokens as the text row's in the mixed batch."""
  model, prompts, _, ref, _ = batch
  out = greedy_sample(model, [prompts[2]], [[]])
  np.testing.assert_array_equal(out.tokens[0], ref[2])


def test_refuses_image_pads_that_do_not_match_the_row_images(batch):
  model, prompts, images, _, _ = batch
  with pytest.raises(ValueError, match="prompt 1: 4 image pad tokens, its images take 1"):
    greedy_sample(model, [prompts[1], prompts[1]], [images[1], [image(9, 28, 28)]])
  with pytest.raises(ValueError, match="2 rows of images for 3 prompts"):
    greedy_sample(model, prompts, images[:2])
  with pytest.raises(ValueError, match="450 x 448 px"):
    greedy_sample(model, prompts[2:], [[image(0, 450, 448)]])


def test_normalize_matches_the_processor():
  """uint8 [H, W, 3] -> rescaled, normalised [3, H, W], as Qwen2VLImageProcessor does."""
  try:
    from transformers import Qwen2VLImageProcessor
    processor = Qwen2VLImageProcessor()
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"transformers' image processor unavailable offline: {e}")
  rgb = np.random.RandomState(0).randint(0, 256, (56, 84, 3)).astype(np.uint8)
  out = processor(images=[rgb], do_resize=False, return_tensors="np")
  pixels, _ = vision.patchify(vision.normalize(rgb), vision.QWEN25_VL_7B)
  np.testing.assert_allclose(out["pixel_values"], pixels, atol=1e-5)
  with pytest.raises(ValueError, match="expected uint8"):
    vision.normalize(rgb.astype(np.float32))


def test_many_images_run_through_the_tower_in_passes(batch, monkeypatch):
  """Five images of one size with passes of two (the last padded): the same tokens as one pass."""
  model = batch[0]
  pixels, grids, _ = vl_sampling.pixels_of(model.config, [[image(i, 56, 84) for i in range(5)]])
  whole = vl.image_features(model.params, model.config, pixels, grids)
  monkeypatch.setattr(vl, "TOWER_IMAGES", 2)
  passes = vl.image_features(model.params, model.config, pixels, grids)
  assert passes.shape == whole.shape == (5 * 6, 64)
  np.testing.assert_allclose(np.asarray(passes), np.asarray(whole), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("data,model_axis", [(4, 2), (2, 4)])
def test_over_a_mesh_the_same_tokens(batch, eight_devices, data, model_axis):
  """The language model's weights over `model`, the rows and their image inputs over `data`."""
  model, prompts, images, ref, _ = batch
  mesh = sharding.make_mesh(data, model_axis)
  params = dataclasses.replace(model.params, text=sharding.shard_params(model.params.text, mesh))
  settings = GenerationSettings(max_new_tokens=STEPS, sampling=GREEDY)
  out = vl_sampling.sample(dataclasses.replace(model, params=params), prompts, images, settings,
                           rng=jax.random.key(0), mesh=mesh)
  np.testing.assert_array_equal(out.tokens, ref)
