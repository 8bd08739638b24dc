"""The image drill of a toy Qwen2.5-VL backbone (issue 56 item 5, a first part): read an emblem
of the synthetic world (`datasets.world_emblems`) and write its caption ("a red triangle emblem
with three white dots on a grey field"), trained from scratch on this CPU.

  python -m apex_jax.toy.emblem_reading --steps=300 --log=assets/toy_vl_emblems.log

The model: a random Qwen2.5-VL written by transformers (language model hidden 128, 2 layers;
tower depth 2, hidden 64), all its weights trained (the tower too: nothing is pretrained). A
row: `<|vision_start|>` + the image's pads + `<|vision_end|>` + the caption's words +
`<|im_end|>`, the loss on the words and the end. Images: an emblem's search-result copies
(turned, scaled, moved, tinted: `render(variant > 0)`), resized to `--image_size` (a size
bucket, `VlGenerator.image_size`). Held out: a share of the 3072 attribute combinations never
trained on; the log reports, on their variant-0 images, each attribute word's teacher-forced
argmax accuracy and the share of captions right in every word. This is the reading drill
alone: the APEx prompt drills of the text toy and the demo are not built on it yet.
"""

from __future__ import annotations

import json
import random
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from apex_jax.datasets import world_emblems
from apex_jax.tools import images as images_lib
from morse_jax.llm import model as llm_model
from morse_jax.llm import vision, vl

SPECIAL = ("<|endoftext|>", "<|im_end|>")
VISION = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")


def emblems(seed: int) -> list[world_emblems.Emblem]:
  """Every attribute combination once, in a seeded order."""
  ids = [str(i) for i in range(world_emblems.COMBINATIONS)]
  drawn = world_emblems.draw(seed, ids)
  order = random.Random(f"reading:{seed}").sample(ids, len(ids))
  return [drawn[i] for i in order]


def vocabulary() -> dict[str, int]:
  """Specials, every caption word, then the vision tokens."""
  words = sorted({w for e in emblems(0) for w in world_emblems.caption(e).split()})
  return {w: i for i, w in enumerate(SPECIAL + tuple(words) + VISION)}


def caption_words() -> int:
  """The longest caption's words (a "pale blue" field has one more)."""
  return max(len(world_emblems.caption(e).split()) for e in emblems(0))


def row(vocab: dict[str, int], emblem, pads: int, words: int) -> tuple[list[int], list[int]]:
  """(tokens, loss mask) of one drill row, right-padded to `words` caption words + the end."""
  said = [vocab[w] for w in world_emblems.caption(emblem).split()] + [vocab["<|im_end|>"]]
  image = [vocab["<|vision_start|>"]] + [vocab["<|image_pad|>"]] * pads + \
      [vocab["<|vision_end|>"]]
  pad = words + 1 - len(said)
  return (image + said + [vocab["<|endoftext|>"]] * pad,
          [0] * len(image) + [1] * len(said) + [0] * pad)


def hf_config(vocab: dict[str, int]):
  from transformers import Qwen2_5_VLConfig

  text = dict(vocab_size=len(vocab), hidden_size=128, intermediate_size=256,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                   mrope_section=[4, 6, 6]))
  vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                window_size=112, fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2,
                temporal_patch_size=2)
  return Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                          image_token_id=vocab["<|image_pad|>"],
                          video_token_id=vocab["<|video_pad|>"],
                          vision_start_token_id=vocab["<|vision_start|>"],
                          vision_end_token_id=vocab["<|vision_end|>"])


def random_model(vocab: dict[str, int], seed: int):
  import torch
  from transformers import Qwen2_5_VLForConditionalGeneration

  torch.manual_seed(seed)
  with tempfile.TemporaryDirectory() as folder:
    Qwen2_5_VLForConditionalGeneration(hf_config(vocab)).save_pretrained(folder)
    return vl.load(folder)


def batch(config, vocab, shown: list, size: int):
  """(tokens [n, t], loss mask, pixel values, grids) of (emblem, image) pairs."""
  patched = [vision.patchify(vision.normalize(images_lib.resized(image, size)), config.vision)
             for _, image in shown]
  grids = [g for _, g in patched]
  words = caption_words()
  rows = [row(vocab, e, config.image_tokens(g), words) for (e, _), g in zip(shown, grids)]
  return (np.asarray([t for t, _ in rows], np.int32), np.asarray([m for _, m in rows], np.float32),
          np.concatenate([p for p, _ in patched]), grids)


def layout(config, tokens: np.ndarray, grids) -> tuple:
  """(index [b, t], positions [b, 3, t]) of rows whose one image block sits at the same place:
  found on the host once, so that the jitted step takes the tokens as a traced array."""
  positions, _ = vl.rope_index(tokens, config, grids)
  is_image = tokens == config.image_token_id
  index = np.where(is_image, np.cumsum(is_image, axis=1) - 1, -1).astype(np.int32)
  return index, np.moveaxis(positions, 0, 1).astype(np.int32)


def loss_fn(params, config, tokens, mask, pixels, grids, index, positions):
  """Mean next-token loss on the masked positions; also the argmax hits per position."""
  features = vl.image_features(params, config, pixels, grids)
  images = vl.ImageRows(features=features.reshape(tokens.shape[0], -1, features.shape[-1]),
                        index=index, positions=positions)
  logits, _ = llm_model.forward(params.text, config.text, tokens, positions=images.streams,
                                embeds=vl.embed_rows(params.text.embed, tokens, images))
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  target, m = tokens[:, 1:], mask[:, 1:]
  nll = -jnp.take_along_axis(logp, target[..., None], -1)[..., 0]
  hits = (jnp.argmax(logp, -1) == target).astype(jnp.float32)
  return jnp.sum(nll * m) / jnp.sum(m), hits * m


# the caption's word of each attribute: "a {colour} {shape} emblem with {count} {ink} {marks}
# on a {field} field" (a two-word field's first word)
ATTRIBUTE_WORDS = {"colour": 1, "shape": 2, "count": 5, "marks": 7, "field": 10}


def accuracy(hits, mask, image_block: int) -> dict:
  """The argmax accuracy over the caption's words, per attribute word (caption word j is token
  image_block + j, predicted at position image_block + j - 1), and the share of captions right
  in every word and the end."""
  hits, mask = np.asarray(hits), np.asarray(mask)[:, 1:]
  out = {"word_accuracy": float(hits.sum() / mask.sum()),
         "captions_right": float(np.mean(np.all((hits == 1) | (mask == 0), axis=1)))}
  for name, j in ATTRIBUTE_WORDS.items():
    out[name] = float(np.mean(hits[:, image_block + j - 1]))
  return out


def main(argv):
  del argv
  if flags.FLAGS.steps < 2:
    raise app.UsageError(f"--steps must be at least 2 (warmup, then decay); got {flags.FLAGS.steps}")
  vocab = vocabulary()
  model = random_model(vocab, flags.FLAGS.seed)
  config, params = model.config, model.params
  all_emblems = emblems(flags.FLAGS.seed)
  held, train = all_emblems[:flags.FLAGS.held_out], all_emblems[flags.FLAGS.held_out:]
  held_batch = batch(config, vocab, [(e, world_emblems.render(e)) for e in held], flags.FLAGS.image_size)
  schedule = optax.warmup_cosine_decay_schedule(0.0, flags.FLAGS.lr, min(10, flags.FLAGS.steps - 1),
                                                flags.FLAGS.steps)
  opt = optax.adamw(schedule, weight_decay=0.0)
  state = opt.init(params)

  grids = held_batch[3][:1] * flags.FLAGS.batch  # every image of a size: one grid
  index, positions = layout(config, held_batch[0][:flags.FLAGS.batch], grids)
  held_layout = layout(config, held_batch[0], held_batch[3])
  block = config.image_tokens(grids[0]) + 2  # vision start, pads, vision end

  @jax.jit
  def step(params, state, tokens, mask, pixels):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, config, tokens, mask, pixels, grids, index, positions)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  @jax.jit
  def evaluate(params, tokens, mask, pixels):
    return loss_fn(params, config, tokens, mask, pixels, held_batch[3], *held_layout)

  rng = random.Random(f"reading-batches:{flags.FLAGS.seed}")
  log = open(flags.FLAGS.log, "a") if flags.FLAGS.log else None

  def record(entry):
    print(json.dumps(entry), flush=True)
    if log:
      log.write(json.dumps(entry) + "\n")
      log.flush()

  record({"command": "python -m apex_jax.toy.emblem_reading", "steps": flags.FLAGS.steps,
          "batch": flags.FLAGS.batch, "image_size": flags.FLAGS.image_size, "lr": flags.FLAGS.lr,
          "held_out": flags.FLAGS.held_out, "seed": flags.FLAGS.seed, "vocab": len(vocab),
          "params_language_model": config.text.num_params()})
  start = time.time()
  for i in range(flags.FLAGS.steps + 1):
    if i % flags.FLAGS.eval_every == 0 or i == flags.FLAGS.steps:
      loss, hits = evaluate(params, *held_batch[:3])
      record({"step": i, "held_out_loss": round(float(loss), 4),
              **{k: round(v, 4) for k, v in accuracy(hits, held_batch[1], block).items()},
              "seconds": round(time.time() - start, 1)})
    if i == flags.FLAGS.steps:
      break
    shown = [(e, world_emblems.render(e, 1 + rng.randrange(4), f"{i}:{k}"))
             for k, e in enumerate(rng.sample(train, flags.FLAGS.batch))]
    tokens, mask, pixels, _ = batch(config, vocab, shown, flags.FLAGS.image_size)
    params, state, loss = step(params, state, tokens, mask, pixels)
    if i % 10 == 0:
      record({"step": i, "train_loss": round(float(loss), 4)})


def define_flags() -> None:
  """The command line's flags, defined when run as a program, not at import: tests import
  this module beside launchers whose flags share names (absl flags are process-wide)."""
  flags.DEFINE_integer("steps", 300, "Optimiser steps.")
  flags.DEFINE_integer("batch", 32, "Rows per step.")
  flags.DEFINE_integer("image_size", 112, "Image side in px (a multiple of 28).")
  flags.DEFINE_float("lr", 2e-3, "AdamW learning rate (cosine decay after 10 warmup steps).")
  flags.DEFINE_integer("held_out", 256, "Attribute combinations never trained on.")
  flags.DEFINE_integer("eval_every", 50, "Steps between held-out evaluations.")
  flags.DEFINE_integer("seed", 0, "Model, emblem order and batch seed.")
  flags.DEFINE_string("log", None, "Append the JSON lines of the run to this file.")


if __name__ == "__main__":
  define_flags()
  app.run(main)
