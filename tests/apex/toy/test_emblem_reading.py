"""The toy VL backbone's reading drill (apex_jax.toy.emblem_reading): its vocabulary, rows,
host-side layout and accuracy; a short run that learns (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from apex_jax.datasets import world_emblems
from apex_jax.toy import emblem_reading as er
from morse_jax.llm import vl

PALE = world_emblems.Emblem("star", "red", "dots", 3, "pale blue")
PLAIN = world_emblems.Emblem("circle", "orange", "bars", 1, "grey")


@pytest.fixture(scope="module")
def vocab():
  return er.vocabulary()


def test_vocabulary_holds_every_caption_word(vocab):
  words = {w for e in er.emblems(0) for w in world_emblems.caption(e).split()}
  assert words <= set(vocab) and len(er.emblems(0)) == world_emblems.COMBINATIONS
  assert sorted(vocab.values()) == list(range(len(vocab)))
  assert [vocab[t] for t in er.VISION] == list(range(len(vocab) - 4, len(vocab)))


def test_rows_are_padded_to_one_length_with_the_loss_on_the_caption(vocab):
  words = er.caption_words()
  (pale, pale_mask), (plain, plain_mask) = (er.row(vocab, e, 16, words) for e in (PALE, PLAIN))
  assert len(pale) == len(plain) == 18 + words + 1 and len(pale_mask) == len(pale)
  names = {i: w for w, i in vocab.items()}
  said = [names[t] for t, m in zip(plain, plain_mask) if m]
  assert said == world_emblems.caption(PLAIN).split() + ["<|im_end|>"]
  assert sum(pale_mask) == len(world_emblems.caption(PALE).split()) + 1 == words + 1
  assert plain[-1] == vocab["<|endoftext|>"] and plain_mask[-1] == 0
  for name, j in er.ATTRIBUTE_WORDS.items():  # the attribute words where the accuracy reads
    value = {"colour": PALE.colour, "shape": PALE.shape, "count": "three", "marks": "dots",
             "field": "pale"}[name]
    assert names[pale[18 + j]] == value


def test_layout_numbers_the_image_pads(vocab):
  config = vl.VlConfig.from_hf_dict(er.hf_config(vocab).to_dict())
  tokens = np.asarray([er.row(vocab, e, 16, er.caption_words())[0] for e in (PALE, PLAIN)])
  index, positions = er.layout(config, tokens, [(1, 8, 8)] * 2)
  np.testing.assert_array_equal(index[:, 1:17], np.tile(np.arange(16), (2, 1)))
  assert (index[:, 0] == -1).all() and (index[:, 17:] == -1).all()
  assert positions.shape == (2, 3, tokens.shape[1])
  want, _ = vl.rope_index(tokens, config, [(1, 8, 8)] * 2)
  np.testing.assert_array_equal(positions, np.moveaxis(want, 0, 1))


def test_accuracy_reads_the_attribute_words():
  block, t = 18, 18 + 13
  mask = np.zeros((2, t), np.float32)
  mask[:, block:] = 1
  hits = np.asarray(mask[:, 1:])  # every word right
  hits_wrong = hits.copy()
  hits_wrong[1, block + er.ATTRIBUTE_WORDS["shape"] - 1] = 0
  right = er.accuracy(hits, mask, block)
  assert right["captions_right"] == 1.0 and right["shape"] == 1.0
  wrong = er.accuracy(hits_wrong, mask, block)
  assert wrong["captions_right"] == 0.5 and wrong["shape"] == 0.5 and wrong["colour"] == 1.0


@pytest.mark.slow  # 37-70 s on 2 cores (by load): the step's compile
def test_a_short_run_learns(tmp_path):
  log = tmp_path / "log.jsonl"
  flags.FLAGS(["emblem_reading", "--steps=12", "--eval_every=12", "--held_out=32",
               f"--log={log}"])
  try:
    er.main([])
  finally:
    flags.FLAGS.unparse_flags()
  lines = [json.loads(x) for x in log.read_text().splitlines()]
  losses = [x["held_out_loss"] for x in lines if "held_out_loss" in x]
  assert len(losses) == 2 and losses[1] < losses[0] - 0.5
