"""Qwen2.5-VL on the generation engine: greedy tokens equal `vl_sampling.sample`'s and
`vl.greedy`'s on the tiny random model (text only, one image, two images, an image in a second
turn, all in one engine; prefill chunks that cut images), log-probs within 1e-5; refusals; a
text model's engine untouched."""

import jax
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import engine_steps, vl, vl_sampling
from morse_jax.llm.engine import Engine, EngineConfig, Request
from morse_jax.llm.sampling import GREEDY, GenerationSettings
from tests.llm.test_vl_parity import image, image_run, text

STEPS = 6


@pytest.fixture(scope="module")
def model(vl_folder):
  return vl.load(vl_folder[0])


@pytest.fixture(scope="module")
def rows(model):
  """(prompts, images) by case: text, one image, two images, an image in the second turn."""
  config = model.config
  one, two_a, two_b, later = image(0, 112, 112), image(1, 56, 84), image(2, 56, 56), image(3, 84, 56)
  run = lambda img: image_run(config, vl_sampling.pixels_of(config, [[img]])[1][0])
  cases = {
      "text": (text(5, 11), []),
      "one_image": (text(3, 6) + run(one) + text(4, 5), [one]),
      "two_images": (text(0, 4) + run(two_a) + text(1, 3) + run(two_b) + text(2, 2),
                     [two_a, two_b]),
      # a first turn of text and an answer, then a user turn with an image
      "second_turn": (text(6, 7) + text(7, 5) + text(8, 3) + run(later) + text(9, 4), [later]),
  }
  return cases


def settings():
  return GenerationSettings(max_new_tokens=STEPS, sampling=GREEDY)


def engine_of(model, chunk=64):
  return Engine(model, EngineConfig(slots=4, max_len=128, page_size=8, prefill_chunk=chunk,
                                    steps_per_call=4))


def static(model, prompts, images):
  return vl_sampling.sample(model, prompts, images, settings(), rng=jax.random.key(0))


# each case alone: slow (the mixed-rows test below runs all four in one engine by default)
@pytest.mark.slow
@pytest.mark.parametrize("case", ["text", "one_image", "two_images", "second_turn"])
def test_each_case_alone_equals_the_static_sampler_and_vl_greedy(model, rows, case):
  prompt, images = rows[case]
  out = engine_of(model).generate([prompt], settings(), rng=jax.random.key(0), images=[images])
  want = static(model, [prompt], [images])
  np.testing.assert_array_equal(out.tokens, want.tokens)
  np.testing.assert_allclose(out.logprobs, want.logprobs, atol=1e-5)
  pixels, grids, _ = vl_sampling.pixels_of(model.config, [images])
  loop = vl.greedy(model.params, model.config, np.asarray([prompt]), pixels, grids, steps=STEPS)
  np.testing.assert_array_equal(out.tokens, loop)


@pytest.mark.parametrize("chunk", [64, pytest.param(8, marks=pytest.mark.slow)])  # chunks cutting images
def test_mixed_rows_in_one_engine(model, rows, chunk):
  prompts, images = zip(*rows.values())
  out = engine_of(model, chunk).generate(list(prompts), settings(), rng=jax.random.key(0),
                                         images=list(images))
  want = static(model, list(prompts), list(images))
  np.testing.assert_array_equal(out.tokens, want.tokens)
  np.testing.assert_allclose(out.logprobs, want.logprobs, atol=1e-5)
  assert not (out.tokens[1:] == out.tokens[0]).all()  # the rows are not all one answer


def test_image_rows_decode_at_their_rope_delta(model, rows, monkeypatch):
  """With every row's delta taken as 0 (plain slot positions) the image rows' tokens change,
  the text row's do not: the offset is what carries them."""
  prompts, images = zip(*rows.values())
  want = engine_of(model).generate(list(prompts), settings(), rng=jax.random.key(0),
                                   images=list(images))
  real = engine_steps.decode

  def no_offset(*args, **kwargs):
    return real(*args[:11], np.zeros_like(args[11]), **kwargs)

  monkeypatch.setattr(engine_steps, "decode", no_offset)
  out = engine_of(model).generate(list(prompts), settings(), rng=jax.random.key(0),
                                  images=list(images))
  np.testing.assert_array_equal(out.tokens[0], want.tokens[0])
  assert (out.tokens[1:] != want.tokens[1:]).any()


def test_a_group_shares_the_image_prompt(model, rows):
  prompt, images = rows["two_images"]
  engine = engine_of(model)
  handles = engine.submit_group(Request(prompt, STEPS, GREEDY, images=images), 3)
  want = static(model, [prompt], [images]).tokens[0]
  for h in handles:
    np.testing.assert_array_equal(h.result().tokens, want)


def test_refuses_bad_images_by_field(model, rows):
  prompt, images = rows["one_image"]
  engine = engine_of(model)
  with pytest.raises(ValueError, match=r"Request.images: the prompt has 16 image pad tokens, "
                                       r"its 2 images take 22"):
    engine.submit(Request(prompt, 2, images=images + [image(1, 56, 84)]))
  with pytest.raises(ValueError, match=r"Request.images\[0\]: .*shape \(112, 112\)"):
    engine.submit(Request(prompt, 2, images=[np.zeros((112, 112))]))
  with pytest.raises(ValueError, match=r"Request.images\[0\]: .*450 x 448 px"):
    engine.submit(Request(text(1, 3), 2, images=[image(0, 450, 448)]))
  assert not engine.busy


@pytest.mark.slow
def test_text_engine_refuses_images_and_runs_its_old_programs(monkeypatch):
  config = llm.LlmConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                         max_position_embeddings=64)
  text_model = llm.Model(config, llm.init_random(config, jax.random.key(0)))
  engine = Engine(text_model, EngineConfig(slots=2, max_len=32, page_size=8, prefill_chunk=8))
  with pytest.raises(ValueError, match=r"Request.images: 1 image\(s\) given, but the engine's "
                                       r"model has no vision tower"):
    engine.submit(Request([1, 2, 3], 2, images=[image(0, 56, 56)]))
  calls = []
  for name in ("prefill", "decode"):
    real = getattr(engine_steps, name)
    monkeypatch.setattr(engine_steps, name,
                        lambda *a, _real=real, _n=name, **k: calls.append((_n, a)) or _real(*a, **k))
  engine.submit(Request([1, 2, 3], 3)).result()
  # No rope, image or offset: the text model's programs as before the VL path.
  (_, prefill), (_, decode) = calls[:2]
  assert len(prefill) == 9 and len(decode) == 12 and decode[11] is None
