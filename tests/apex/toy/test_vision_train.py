"""The vision toy's model and trainer (apex_jax.toy.vision_train): the text toy behind a tower
reads text as the text toy does, a saved folder loads back the same, and the training loss of a
batch (image slots padded with blanks) equals the loss of `vl.forward`'s logits row by row."""

from __future__ import annotations

import os
import random

import jax
import numpy as np
import pytest

from apex_jax.agents.config import AgentConfig
from apex_jax.agents.vl_generator import VlChatTokenizer
from apex_jax.toy import vision_train as vt
from morse_jax import llm
from morse_jax.llm import vl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
TEXT_TOY = os.path.join(REPO, "assets", "toy_apex")


@pytest.fixture(scope="module")
def model():
  return vt.assemble(TEXT_TOY, seed=0)


def test_text_reads_as_the_text_toy_reads_it(model):
  text = llm.load(TEXT_TOY)
  tokens = np.asarray([text.tokenizer.encode("Who directed the film Vulza? Search it.")], np.int32)
  want, _ = llm.forward(text.params, text.config, tokens)
  got, _ = vl.forward(model.params, model.config, tokens)
  old = text.config.vocab_size
  np.testing.assert_allclose(np.asarray(got)[..., :old], np.asarray(want), atol=2e-5)
  grown = np.asarray(model.params.text.embed)
  assert grown.shape[0] == old + len(vt.VISION_TOKENS)
  np.testing.assert_allclose(grown[old:], np.broadcast_to(grown[:old].mean(0), grown[old:].shape),
                             atol=1e-6)
  assert model.config.text.qk_norm and model.config.text.mrope_section == vt.MROPE_SECTION


def test_a_saved_toy_loads_back_the_same(model, tmp_path):
  vl.save(model, str(tmp_path))
  back = vl.load(str(tmp_path))
  assert back.config == model.config and back.stop_ids == model.stop_ids
  for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
    np.testing.assert_array_equal(a, b)
  assert back.tokenizer.hf.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id


def test_the_training_loss_is_vl_forwards_row_by_row(model):
  agent = AgentConfig(prompts="compact", topk=2)
  convs = vt.image_conversations(11, 60, 24, agent, random.Random(0))
  kinds = {c["kind"]: c for c in convs}  # one of each: reading (1 image), run (4), plan (0)
  tok = VlChatTokenizer(model.tokenizer, image_size=56)
  rows = vt.rows([kinds["apex_see"], kinds["image_execute"], kinds["image_plan"]], tok, 2048,
                 model.config.vision_start_token_id)
  assert [len(r.images) for r in rows] == [1, 4, 0]
  length = max(len(r.tokens) for r in rows)
  pixels = vt.Pixels(model.config.vision, 56)
  arrays = vt.batch_arrays(rows, length, 56, model.config, pixels, model.tokenizer.pad_id)
  nll, n, _ = jax.device_get(vt.loss_sums(model.params, model.config, pixels.grid, arrays))
  for k, r in enumerate(rows):
    own = [pixels(x) for x in r.images]
    logits, _ = vl.forward(model.params, model.config, r.tokens[None],
                           np.concatenate(own) if own else None, [pixels.grid] * len(own))
    logp = jax.nn.log_softmax(np.asarray(logits[0, :-1], np.float64))
    want = -sum(float(logp[t, r.tokens[t + 1]]) for t in range(len(r.tokens) - 1) if r.mask[t + 1])
    assert n[k] == r.mask[1:].sum()
    np.testing.assert_allclose(nll[k], want, rtol=2e-5)


@pytest.mark.slow  # ~30 s alone: a second compile of the whole model's gradient
def test_a_reading_run_at_lr_0_trains_the_tower_alone(model):
  import optax

  rows = vt.rows(vt.reading_conversations(11, (2,))[:2], VlChatTokenizer(model.tokenizer, 56), 256,
                 model.config.vision_start_token_id)
  assert [len(r.images) for r in rows] == [1, 1]
  pixels = vt.Pixels(model.config.vision, 56)
  arrays = vt.batch_arrays(rows, max(len(r.tokens) for r in rows), 56, model.config, pixels,
                           model.tokenizer.pad_id)
  opt = vt.optimizer(steps=2, lr=0.0, tower_lr=1e-3)

  def loss(p):
    nll, n, _ = vt.loss_sums(p, model.config, pixels.grid, arrays)
    return nll.sum() / n.sum()

  after, state = model.params, opt.init(model.params)
  for _ in range(2):  # the schedule's first step is the warmup's 0
    updates, state = opt.update(jax.grad(loss)(after), state, after)
    after = optax.apply_updates(after, updates)
  for a, b in zip(jax.tree.leaves(model.params.text), jax.tree.leaves(after.text)):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(model.params.vision),
                                                      jax.tree.leaves(after.vision)))
