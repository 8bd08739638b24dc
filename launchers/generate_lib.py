"""What `launchers.generate` runs, apart from its flags so that tests import it beside other
launchers (absl flags are process-wide): its default tiny random model and the sampler it picks
(the engine on one device, `llm.sample` over a larger mesh), and for a Qwen2.5-VL folder with
`--image` files the images read and the prompts and sampler with them (the engine with images on
one device, `vl_sampling.sample` over a larger mesh)."""

from __future__ import annotations


from apex_jax.agents import vision_chat
from morse_jax.llm.vl import is_vl_folder  # noqa: F401 -- the launcher's import
from apex_jax.tools import images as images_lib



def tiny_random_model():
  import jax

  from morse_jax import llm

  config = llm.LlmConfig("llama", vocab_size=512, hidden_size=64, intermediate_size=192,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
  params = llm.init_random(config, jax.random.key(0), scale=0.3, norm_jitter=0.1)
  return llm.Model(config=config, params=params)


def sampler(model, rows, settings, mesh):
  """rng -> SampleOutput for `rows`: the engine on one device (row i draws with fold_in(rng, i),
  as `llm.sample`), `llm.sample` over a larger mesh."""
  from morse_jax import llm
  from morse_jax.llm.engine import Engine, config_for_rows

  if mesh.size > 1:
    return lambda rng: llm.sample(model, rows, settings, rng=rng, mesh=mesh)
  engine = Engine(model, config_for_rows(rows, settings.max_new_tokens,
                                         model.config.max_position_embeddings))
  return lambda rng: engine.generate(rows, settings, rng=rng)


def read_images(paths):
  """Image files -> normalised [3, 448, 448] arrays (the executor's size, `images.read`); an
  unreadable, undecodable or oversized file is an `ImageError` naming it."""
  from morse_jax.llm import vision

  return [vision.normalize(images_lib.read(path)) for path in paths]


def vl_prompt(model, prompt, n_images: int, rng) -> list[int]:
  """One prompt's ids with `n_images` 448 x 448 images before the text: Qwen2.5-VL's chat as
  `vision_chat.qwen_vl_text` renders it, or, without a tokenizer, random text ids (none of the
  vision tokens) after one vision start, image pads, vision end run per image."""
  from morse_jax.llm import vision

  tok, config = model.tokenizer, model.config
  per_image = config.image_tokens(vision.image_grid(config.vision))
  if tok is not None:
    messages = [{"role": "user", "content": images_lib.MARKER * n_images + prompt}]
    text = vision_chat.qwen_vl_text(messages, [None] * n_images,
                                    tokens_per_image=per_image)
    return tok.encode(text, parse_special_tokens=True)
  special = {config.image_token_id, config.video_token_id, config.vision_start_token_id,
             config.vision_end_token_id}
  words = [i for i in range(config.text.vocab_size) if i not in special]
  run = [config.vision_start_token_id] + [config.image_token_id] * per_image + [
      config.vision_end_token_id]
  return run * n_images + rng.choice(words, 8).tolist()


def vl_sampler(model, rows, images, settings, mesh=None):
  """rng -> SampleOutput, every row with the same `images`: the engine on one device,
  `vl_sampling.sample` (the static sampler) over `mesh` when it has more than one device."""
  from morse_jax.llm import vl_sampling
  from morse_jax.llm.engine import Engine, config_for_rows

  per_row = [images] * len(rows)
  if mesh is not None and mesh.size > 1:
    return lambda rng: vl_sampling.sample(model, rows, per_row, settings, rng=rng, mesh=mesh)
  positions = model.config.text.max_position_embeddings
  engine = Engine(model, config_for_rows(rows, settings.max_new_tokens, positions))
  return lambda rng: engine.generate(rows, settings, rng=rng, images=per_row)
