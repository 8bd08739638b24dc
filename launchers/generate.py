"""Generate from a Hugging Face folder, or from a tiny random model when none is given.

  python -m launchers.generate                                  # tiny random Llama, token ids
  python -m launchers.generate --model=/ckpt/Qwen3-4B --prompt="Write a haiku" --temperature=0.7
  python -m launchers.generate --model=DIR --mesh=2x4           # rows over data, weights over model
  python -m launchers.generate --model=/ckpt/Qwen2.5-VL-7B-Instruct --image=a.png --image=b.jpg \
      --prompt="What is in these pictures?"                     # images, each resized to 448 x 448

On one device the rows run on the generation engine (`llm.engine`: a slot per row, a paged
cache); over a mesh on `llm.sample`, the static sampler, until the engine shards its pool. A
Qwen2.5-VL folder (model_type qwen2_5_vl) runs on the engine too (the tower once per row), over a
mesh on `vl_sampling.sample`, every prompt with the `--image` files before its text (a file that
is not a readable image is refused by name).
"""

from __future__ import annotations

import dataclasses
import time

from absl import app, flags, logging

from apex_jax.tools import images as images_lib
from launchers.generate_lib import (is_vl_folder, read_images, sampler, tiny_random_model,
                                    vl_prompt, vl_sampler)

_MODEL = flags.DEFINE_string("model", None, "Hugging Face folder; default a tiny random Llama.")
_PROMPTS = flags.DEFINE_multi_string("prompt", ["Hello"], "Prompt(s); chat-templated if possible.")
_ROWS = flags.DEFINE_integer("rows", 4, "Samples per prompt.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Tokens to generate per row.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "0 for greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus filter (1 = off).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k filter (0 = off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Weights dtype (default: file's).")
_MESH = flags.DEFINE_string("mesh", "1x1", "DATAxMODEL device mesh.")
_IMAGES = flags.DEFINE_multi_string("image", [], "Image file (repeatable), before every prompt's "
                                    "text, resized to 448 x 448; needs a Qwen2.5-VL --model.")


def banner(text: str) -> None:
  print(f"\n==== {text} " + "=" * max(0, 60 - len(text)), flush=True)


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np

  from morse_jax import llm
  from morse_jax.llm import sharding, vl

  vl_model = bool(_MODEL.value) and is_vl_folder(_MODEL.value)
  if _IMAGES.value and not vl_model:
    raise app.UsageError(f"--image needs a Qwen2.5-VL --model (config.json model_type "
                         f"qwen2_5_vl); got --model={_MODEL.value!r}")
  try:
    images = read_images(_IMAGES.value)
  except images_lib.ImageError as e:
    raise app.UsageError(f"--image: {e}") from None
  banner("load")
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}.get(_DTYPE.value)
  if vl_model:
    return generate_vl(vl.load(_MODEL.value, dtype=dtype or jnp.float32), images,
                       sharding.make_mesh(*(int(n) for n in _MESH.value.lower().split("x"))))
  if _MODEL.value:
    model = llm.load(_MODEL.value, dtype=dtype)
  else:
    logging.info("no --model: using a tiny random Llama (token ids only, no tokenizer)")
    model = tiny_random_model()
  print(f"{model.config.model_type}: {model.config.num_params() / 1e6:.2f}M parameters, "
        f"{model.config.num_layers} layers, on {jax.device_count()} {jax.default_backend()} device(s)")

  data, model_axis = (int(n) for n in _MESH.value.lower().split("x"))
  mesh = sharding.make_mesh(data, model_axis)
  if mesh.size > 1:  # one device: the engine's programs keep their inputs' single-device layout
    model = dataclasses.replace(model, params=sharding.shard_params(model.params, mesh))

  tok = model.tokenizer
  if tok is None:
    rng = np.random.RandomState(_SEED.value)
    prompts = [rng.randint(0, model.config.vocab_size, 8 + 4 * i).tolist()
               for i in range(len(_PROMPTS.value))]
  else:
    def encode(text):
      if tok.has_chat_template:
        return tok.apply_chat_template([{"role": "user", "content": text}])
      # no template: the prompt is the user's own raw prompt, special tokens and all
      return tok.encode(text, add_special_tokens=True, parse_special_tokens=True)
    prompts = [encode(p) for p in _PROMPTS.value]
  rows = [p for p in prompts for _ in range(_ROWS.value)]

  banner("generate")
  settings = llm.GenerationSettings.for_model(model, _MAX_NEW.value, sampling_config())
  report(sampler(model, rows, settings, mesh), tok, len(rows))


def generate_vl(model, images, mesh) -> None:
  """A Qwen2.5-VL folder: every prompt with the images before its text; over a mesh the
  language model's weights placed on it (the tower stays on one device)."""
  import numpy as np

  from morse_jax import llm
  from morse_jax.llm import sharding

  if mesh.size > 1:
    text = sharding.shard_params(model.params.text, mesh)
    model = dataclasses.replace(model, params=dataclasses.replace(model.params, text=text))

  print(f"qwen2_5_vl: {model.config.text.num_params() / 1e6:.2f}M language-model parameters, "
        f"{model.config.text.num_layers} layers, {len(images)} image(s) of 448 x 448 per prompt")
  rng = np.random.RandomState(_SEED.value)
  prompts = [vl_prompt(model, p, len(images), rng) for p in _PROMPTS.value]
  rows = [p for p in prompts for _ in range(_ROWS.value)]
  banner("generate")
  settings = llm.GenerationSettings.for_model(model.text, _MAX_NEW.value, sampling_config())
  report(vl_sampler(model, rows, images, settings, mesh), model.tokenizer, len(rows))


def sampling_config():
  from morse_jax import llm

  return llm.SamplingConfig(temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
                            top_k=_TOP_K.value)


def report(run, tok, n_rows: int) -> None:
  """Runs `run` twice (compile, then timed) and prints the second call's rows and speed."""
  import jax

  start = time.perf_counter()
  run(jax.random.key(_SEED.value))
  first = time.perf_counter() - start
  start = time.perf_counter()
  out = run(jax.random.key(_SEED.value + 1))
  elapsed = time.perf_counter() - start
  for i, (tokens, length) in enumerate(zip(out.tokens, out.lengths)):
    ids = tokens[:length].tolist()
    text = tok.decode(ids) if tok else " ".join(map(str, ids))
    print(f"[{i}] ({length} tokens, mean log-prob {out.logprobs[i, :length].mean():.2f}) {text}")
  banner("speed")
  print(f"first call (compile + run) {first:.2f}s; second call {elapsed:.3f}s: "
        f"{out.lengths.sum() / elapsed:.1f} generated tokens/s over {n_rows} rows")


if __name__ == "__main__":
  app.run(main)
