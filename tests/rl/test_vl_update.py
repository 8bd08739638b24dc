"""The update on Qwen2.5-VL rows (rl.vl_inputs): the frozen tower's tokens in the decoder's
inputs, LoRA experts on the language model; log-probs equal to `vl.forward`'s, the gradient equal
to the text path's on an image-free batch and to a finite difference on an image batch, no
gradient to the tower, one jitted step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import lora
from morse_jax.llm import vl
from morse_jax.rl import compaction
from morse_jax.rl import train_step as ts
from morse_jax.rl import update as update_lib
from morse_jax.rl import vl_inputs
from morse_jax.rl.batch import Segment, update_batch
from morse_jax.rl.logprobs import log_softmax, token_logprobs
from tests.llm.test_vl_parity import image, image_run, text

LORA = lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=2)
ADVANTAGES = jnp.asarray([1.0, -1.0, 0.5, -0.5])


@pytest.fixture(scope="module")
def setup(vl_folder):
  model = vl.load(vl_folder[0])
  experts = lora.init_experts(LORA, model.config.text, jax.random.key(1))
  # Non-zero B, so that the adapted model differs from the backbone.
  experts = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape),
                         experts)
  update = update_lib.Update(model.config.text, LORA, ts.StepConfig(expert_lr=1e-2), donate=())
  return model, experts, update


def rows_of(model, with_images: bool, rewards=(1.0, 0.0, 0.6, 0.1)):
  """Four rows (two groups of two): prompts with one image, one image, two images, none; each
  with a generated answer of its own. Without images, each image run is text of its length (the
  same shapes: one compiled gradient for both)."""
  images = [[image(0, 56, 56)], [image(0, 56, 56)], [image(1, 56, 84), image(2, 56, 56)], []]
  runs = [[image_run(model.config, (1, i.shape[1] // 14, i.shape[2] // 14)) for i in row]
          for row in images]
  if not with_images:
    runs = [[text(20 + len(r), len(r)) for r in row] for row in runs]
    images = [[] for _ in images]
  prompts = [text(3, 3) + sum(r, []) + text(4, 4) for r in runs]
  answers = [text(10 + i, 3 + i) for i in range(4)]
  rows = [[Segment(p), Segment(a, [-1.0] * len(a))] for p, a in zip(prompts, answers)]
  batch = update_batch(rows, rewards, [0, 0, 1, 1], [[0, 2], [0, 2], [1, 3], [1, 3]])
  return batch, images


_grads = jax.jit(ts._expert_grads, static_argnames=("update",))


def expert_loss_and_grads(update, model, experts, batch):
  (loss, _), grads = _grads(model.params.text, experts, batch, ADVANTAGES, update)
  return loss, grads


def test_logprobs_equal_the_vl_forward(setup):
  """token_logprobs on the batch's image inputs (no adapter) = log-softmax of `vl.forward`."""
  model, _, _ = setup
  batch, images = rows_of(model, True)
  batch = vl_inputs.with_images(batch, model, images)
  logp, _ = token_logprobs(model.params.text, model.config.text, None, batch.tokens,
                           batch.attention_mask, images=batch.images)
  tokens, mask = np.asarray(batch.tokens), np.asarray(batch.attention_mask)
  grids = [(1, i.shape[1] // 14, i.shape[2] // 14) for row in images for i in row]
  pixels = np.concatenate([vl_inputs.pixels_of(model.config, images)[0]])
  logits, _ = vl.forward(model.params, model.config, tokens, pixels, grids, attention_mask=mask)
  want = np.take_along_axis(np.asarray(log_softmax(logits))[:, :-1], tokens[:, 1:, None],
                            axis=-1)[..., 0]
  real = mask[:, 1:].astype(bool)
  np.testing.assert_allclose(np.asarray(logp)[:, 1:][real], want[real], atol=1e-5)


def test_image_batch_gradient_matches_a_finite_difference(setup):
  model, experts, update = setup
  batch, images = rows_of(model, True)
  batch = vl_inputs.with_images(batch, model, images)
  loss, grads = expert_loss_and_grads(update, model, experts, batch)
  pads_only = dataclasses.replace(batch, images=dataclasses.replace(
      batch.images, index=jnp.full_like(batch.images.index, -1)))  # the pads' own embeddings
  pads_loss, _ = expert_loss_and_grads(update, model, experts, pads_only)
  assert abs(float(loss) - float(pads_loss)) > 1e-4  # the images reach the loss
  keys = iter(jax.random.split(jax.random.key(7), 16))
  direction = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), experts)
  h = 1e-2
  shifted = lambda s: jax.tree.map(lambda e, d: e + s * h * d, experts, direction)
  numeric = (expert_loss_and_grads(update, model, shifted(1), batch)[0]
             - expert_loss_and_grads(update, model, shifted(-1), batch)[0]) / (2 * h)
  analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads),
                                                jax.tree.leaves(direction)))
  print(f"directional derivative: analytic {float(analytic):.6f}, numeric {float(numeric):.6f}")
  np.testing.assert_allclose(numeric, analytic, rtol=2e-2)


@pytest.mark.slow
def test_image_free_batch_gradient_equals_the_text_path(setup):
  model, experts, update = setup
  batch, images = rows_of(model, False)
  vl_batch = vl_inputs.with_images(batch, model, images)
  loss, grads = expert_loss_and_grads(update, model, experts, batch)
  vl_loss, vl_grads = expert_loss_and_grads(update, model, experts, vl_batch)
  np.testing.assert_allclose(vl_loss, loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(vl_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_tower_gets_no_gradient(setup):
  model, experts, update = setup
  batch, images = rows_of(model, True)

  def loss_of(vision_params):
    params = vl.VlParams(text=model.params.text, vision=vision_params)
    inputs = vl_inputs.image_inputs(params, model.config, batch.tokens, batch.attention_mask,
                                    images)
    adapter = update.adapter(experts, batch.routes)
    logp, _ = token_logprobs(model.params.text, model.config.text, adapter, batch.tokens,
                             batch.attention_mask, images=inputs)
    return jnp.sum(logp * batch.loss_mask)

  grads = jax.grad(loss_of)(model.params.vision)
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads))


def test_one_jitted_step_on_image_rows_moves_the_experts(setup):
  """`Update` on image rows whose second group is flat: its rows (and their image inputs) are
  left out, the prompts are not shared (no packed layout with images), the experts move."""
  model, experts, update = setup
  batch, images = rows_of(model, True, rewards=(1.0, 0.0, 0.6, 0.6))
  batch = vl_inputs.with_images(batch, model, images)
  kept, _ = compaction.without_flat_nodes(batch, routes_per_node=1, aggregation="token-mean")
  cut = kept.tokens.shape[1]
  assert kept.tokens.shape == (2, 24) and batch.tokens.shape == (4, 32)
  np.testing.assert_array_equal(kept.images.positions,
                                np.asarray(batch.images.positions)[:2, :, :cut])
  np.testing.assert_array_equal(kept.images.index, np.asarray(batch.images.index)[:2, :cut])
  np.testing.assert_array_equal(kept.images.features, np.asarray(batch.images.features)[:2])
  states = update.init_opt_states(experts)
  new, _, _, metrics, info = update(model.params.text, experts, None, states, batch, None,
                                    num_routes=2)
  assert info.compacted.dropped_nodes == 1 and info.shape == (2, 24)
  assert np.isfinite(metrics["expert_loss"]) and metrics["skipped"] == 0
  moved = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(new),
                                                         jax.tree.leaves(experts))]
  assert max(moved) > 0


def test_refuses_images_that_do_not_match_the_rows(setup):
  model, _, _ = setup
  batch, images = rows_of(model, True)
  with pytest.raises(ValueError, match="prompt 2: 10 image pad tokens, its images take 4"):
    vl_inputs.with_images(batch, model, [images[0], images[1], images[0], []])
  with pytest.raises(ValueError, match="images for 5 rows, the batch has 4"):
    vl_inputs.with_images(batch, model, images + [[]])
  with pytest.raises(ValueError, match="image inputs"):
    compaction.share_prefixes(vl_inputs.with_images(batch, model, images))
