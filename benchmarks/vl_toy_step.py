"""What a toy Qwen2.5-VL pretraining step costs on this machine, per image size bucket: the
sizing of issue 56's toy VL backbone (not built yet, docs/RESULTS.md).

  python -m benchmarks.vl_toy_step [--sizes 112,448] [--repeats 3] [--out FILE]

The model: the APEx text toy's language-model shape (hidden 192, 4 layers, vocabulary 2048;
Qwen2 attention, as Qwen2.5-VL's) behind a small tower (depth 4, hidden 96, one full-attention
block), random weights written by transformers. The step: the jitted full-parameter gradient
(tower included, as pretraining trains it) of the token log-likelihood of 4 rows, each 5 runs of
80 text tokens around 4 images (an executor row: the question's image and 3 search results).
Compile time is reported apart from the median step.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
from absl import app, flags

from benchmarks.common import median_seconds, write_report
from morse_jax.llm import vision, vl

_SIZES = flags.DEFINE_list("sizes", ["112", "448"], "Image sides in px (multiples of 28).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per size (median reported).")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")

ROWS, IMAGES, TEXT = 4, 4, 80
IMAGE, START, END = 2040, 2042, 2043  # the config's image pad / vision start / vision end ids
TEXT_CONFIG = dict(vocab_size=2048, hidden_size=192, intermediate_size=576, num_hidden_layers=4,
                   num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=4096,
                   bos_token_id=None, eos_token_id=None,
                   rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                        mrope_section=[8, 12, 12]))
VISION_CONFIG = dict(depth=4, hidden_size=96, intermediate_size=192, num_heads=2,
                     out_hidden_size=192, window_size=112, fullatt_block_indexes=[3],
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2)


def toy_model(folder: str):
  import torch
  from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

  config = Qwen2_5_VLConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG,
                            image_token_id=IMAGE, video_token_id=2041,
                            vision_start_token_id=START, vision_end_token_id=END)
  torch.manual_seed(0)
  Qwen2_5_VLForConditionalGeneration(config).save_pretrained(folder)
  return vl.load(folder)


def batch(config, size: int):
  """(tokens [ROWS, t], pixel_values, grids): random text and random images of `size` px."""
  rs = np.random.RandomState(0)
  images = [rs.randint(0, 256, (size, size, 3)).astype(np.uint8) for _ in range(ROWS * IMAGES)]
  patched = [vision.patchify(vision.normalize(x), config.vision) for x in images]
  grids = [g for _, g in patched]
  rows = []
  for r in range(ROWS):
    row = list(rs.randint(5, 2000, TEXT))
    for grid in grids[r * IMAGES:(r + 1) * IMAGES]:
      row += [START] + [IMAGE] * config.image_tokens(grid) + [END] + list(rs.randint(5, 2000,
                                                                                    TEXT))
    rows.append(row)
  return np.asarray(rows, np.int32), np.concatenate([p for p, _ in patched]), grids


def measure(model, size: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp

  tokens, pixels, grids = batch(model.config, size)

  def loss(params):
    logits, _ = vl.forward(params, model.config, tokens, pixels, grids)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  step = jax.jit(jax.value_and_grad(loss))
  start = time.perf_counter()
  jax.block_until_ready(step(model.params))
  first = time.perf_counter() - start
  seconds = median_seconds(lambda: jax.block_until_ready(step(model.params)), repeats)
  return {"size": size, "tokens_per_row": int(tokens.shape[1]), "rows": ROWS,
          "images_per_row": IMAGES, "compile_and_first_s": round(first, 2),
          "step_s": round(seconds, 3)}


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as folder:
    model = toy_model(folder)
  results = []
  for size in (int(s) for s in _SIZES.value):
    results.append(measure(model, size, _REPEATS.value))
    print(results[-1], flush=True)
  write_report("vl_toy_step", _OUT.value, load_average=os.getloadavg(),
               language_model_params=model.config.text.num_params(), results=results)


if __name__ == "__main__":
  app.run(main)
