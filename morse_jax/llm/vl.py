"""Qwen2.5-VL: the vision tower (`vision.py`) in front of the Qwen2 text decoder (`model.py`).

`forward(params, config, tokens, pixel_values, grids)` embeds the prompt, puts the tower's
merged tokens in place of the image pad tokens (in order: image after image, row after row),
computes the three rotary position streams (`rope_index`, as transformers' `get_rope_index`)
and runs the decoder (`llm.forward` with `embeds` and [3, b, t] positions) to logits.

`load(path)` reads a folder written by transformers (`Qwen2_5_VLForConditionalGeneration`):
config.json's `text_config` (or the older flat layout) and `vision_config`, tensors named as the
Hub's checkpoints name them (`model.layers.*`, `visual.*`, `lm_head.weight`; the
`model.language_model.*` / `model.visual.*` spelling of some transformers versions too), and
the folder's tokenizer and stop ids as `hf.load` reads them.

The batched samplers are `vl_sampling.sample` and the engine (`engine.Engine` on a `VlModel`,
`engine_images`); `greedy` here is a plain test loop of whole passes or one prefill + cache. Not
yet here: video.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm import hf as hf_io
from morse_jax.llm import model as llm_model
from morse_jax.llm import vision
from morse_jax.llm.bundle import Model
from morse_jax.llm.config import ConfigError, LlmConfig
from morse_jax.llm.params import Params
from morse_jax.llm.tokenizer import Tokenizer, load_tokenizer, stop_ids
from morse_jax.llm.vision import Grid, VisionConfig, VisionParams


@dataclasses.dataclass(frozen=True)
class VlConfig:
  text: LlmConfig  # a qwen2 (or, in our toy, qwen3) config with mrope_section
  vision: VisionConfig
  image_token_id: int
  video_token_id: int | None = None
  vision_start_token_id: int | None = None
  vision_end_token_id: int | None = None

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "VlConfig":
    if hf.get("model_type") != "qwen2_5_vl":
      raise ConfigError(f"{source}: model_type {hf.get('model_type')!r} is not 'qwen2_5_vl'")
    text = dict(hf.get("text_config") or hf)  # transformers 5 nests it; older files are flat
    # "qwen3": a Qwen3 language model (q / k norms) behind the tower. No transformers class has
    # that pair; the APEx vision toy is one (its language model is the committed text toy,
    # apex_jax.toy.vision_train). Any other spelling is Qwen2.5-VL's own Qwen2 decoder.
    text["model_type"] = "qwen3" if text.get("model_type") == "qwen3" else "qwen2"
    text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings")
                                       or text.get("tie_word_embeddings"))
    text_config = LlmConfig.from_hf_dict(text, source)
    if text_config.mrope_section is None:
      raise ConfigError(f"{source}: the text config has no rope 'mrope_section'")
    if "vision_config" not in hf:
      raise ConfigError(f"{source}: required field 'vision_config' is missing")
    if "image_token_id" not in hf:
      raise ConfigError(f"{source}: required field 'image_token_id' is missing")
    return cls(text=text_config,
               vision=VisionConfig.from_hf_dict(hf["vision_config"], source),
               image_token_id=int(hf["image_token_id"]),
               video_token_id=hf.get("video_token_id"),
               vision_start_token_id=hf.get("vision_start_token_id"),
               vision_end_token_id=hf.get("vision_end_token_id"))

  def image_tokens(self, grid: Grid) -> int:
    """How many image pad tokens an image of `grid` patches takes in the prompt."""
    t, h, w = grid
    return t * h * w // self.vision.merge_unit


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VlParams:
  text: Params
  vision: VisionParams


@dataclasses.dataclass
class VlModel:
  config: VlConfig
  params: VlParams
  hf_config: dict[str, Any] = dataclasses.field(default_factory=dict)
  tokenizer: Tokenizer | None = None
  stop_ids: tuple[int, ...] = ()

  @property
  def text(self) -> Model:
    """The language model alone (its params, tokenizer and stop ids): what the text sampler,
    `GenerationSettings.for_model` and the update take; the tower stays beside it."""
    return Model(config=self.config.text, params=self.params.text, tokenizer=self.tokenizer,
                 stop_ids=self.stop_ids)


# ---- loading ----

_ALIASES = (("model.", "model.language_model."), ("visual.", "model.visual."))


def is_vl_folder(path: str) -> bool:
  """A folder whose config.json says Qwen2.5-VL (model_type qwen2_5_vl)."""
  config = os.path.join(os.path.expanduser(path), "config.json")
  if not os.path.isfile(config):
    return False
  return hf_io._read_json(config).get("model_type") == "qwen2_5_vl"


def load(path: str, dtype=jnp.float32) -> VlModel:
  """A Qwen2.5-VL folder written by transformers (config.json + safetensors)."""
  path = os.path.abspath(os.path.expanduser(path))
  config_path = os.path.join(path, "config.json")
  hf_config = hf_io._read_json(config_path)
  config = VlConfig.from_hf_dict(hf_config, source=config_path)
  files = hf_io._weight_files(path)
  reader = hf_io._TensorReader(files)

  def name_of(name: str) -> str:
    if name in files:
      return name
    for ours, theirs in _ALIASES:
      if name.startswith(ours) and theirs + name[len(ours):] in files:
        return theirs + name[len(ours):]
    return name  # missing: the reader names it

  text = hf_io.assemble_params(
      config.text, dtype, lambda w, i, shape: reader.get(name_of(w.hf.format(i=i)), shape))
  np_dtype = np.dtype(dtype)

  def build(weight):
    shape = vision.weight_shape(weight, config.vision)
    if not weight.stacked:
      return jnp.asarray(reader.get(name_of(weight.hf), shape).astype(np_dtype))
    stacked = np.empty(shape, np_dtype)
    for i in range(config.vision.depth):
      stacked[i] = reader.get(name_of(weight.hf.format(i=i)), shape[1:])
    return jnp.asarray(stacked)

  params = VlParams(text=text, vision=jax.tree.map(build, vision.VISION_WEIGHTS))
  tokenizer = load_tokenizer(path)
  return VlModel(config=config, params=params, hf_config=hf_config, tokenizer=tokenizer,
                 stop_ids=stop_ids(path, tokenizer))


def save(model: VlModel, path: str) -> None:
  """Writes the folder `load` reads: config.json (`text_config`, `vision_config`, the image
  token ids), one model.safetensors (`model.*` / `lm_head.weight` and `visual.*` as the Hub
  names them) and the tokenizer."""
  from safetensors.numpy import save_file

  path = os.path.abspath(os.path.expanduser(path))
  os.makedirs(path, exist_ok=True)
  config = model.config
  tensors = {**hf_io.hf_tensors(model.params.text, config.text),
             **hf_io.named_tensors(vision.VISION_WEIGHTS, model.params.vision,
                                   config.vision.depth)}
  tmp = os.path.join(path, "model.safetensors.tmp")
  save_file(tensors, tmp, metadata={"format": "pt"})
  os.replace(tmp, os.path.join(path, "model.safetensors"))
  v = config.vision
  hf = {**model.hf_config, "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        # without them transformers' config classes (read by the tokenizer's loader) put in
        # Qwen2.5-VL's own ids, which a smaller vocabulary does not have
        "bos_token_id": None, "eos_token_id": list(model.stop_ids) or None,
        "text_config": {**config.text.to_hf_dict(), "bos_token_id": None,
                        "eos_token_id": list(model.stop_ids) or None},
        "vision_config": {"depth": v.depth, "hidden_size": v.hidden_size,
                          "intermediate_size": v.intermediate_size, "num_heads": v.num_heads,
                          "out_hidden_size": v.out_hidden_size,
                          "fullatt_block_indexes": list(v.fullatt_block_indexes),
                          "window_size": v.window_size, "patch_size": v.patch_size,
                          "temporal_patch_size": v.temporal_patch_size,
                          "spatial_merge_size": v.spatial_merge_size,
                          "in_channels": v.in_channels, "hidden_act": "silu",
                          "rope_parameters": {"rope_theta": v.rope_theta}},
        "image_token_id": config.image_token_id, "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_token_id,
        "vision_end_token_id": config.vision_end_token_id,
        "tie_word_embeddings": config.text.tie_word_embeddings,
        "dtype": str(jnp.dtype(model.params.text.embed.dtype))}
  hf_io._atomic_write_json(hf, os.path.join(path, "config.json"))
  if model.stop_ids:
    hf_io._atomic_write_json({"eos_token_id": list(model.stop_ids)},
                             os.path.join(path, "generation_config.json"))
  if model.tokenizer is not None:
    model.tokenizer.save(path)


# ---- prompts ----


def rope_index(tokens, config: VlConfig, grids: Sequence[Grid] = (),
               attention_mask=None) -> tuple[np.ndarray, np.ndarray]:
  """The three rotary position streams [3, b, t] (int32) and each row's offset [b] (largest
  position + 1 - real tokens: what decoding adds to a plain position), as transformers'
  `get_rope_index`: text tokens count up on all three streams; an image's merged tokens sit at
  (start, start + row, start + column); text after an image continues from start + max(merged
  rows, merged columns). `grids`: every image of the batch in order (row after row). Padding
  (attention_mask 0) gets position 0."""
  tokens = np.asarray(tokens)
  b, t = tokens.shape
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask, bool)
  m = config.vision.spatial_merge_size
  positions = np.zeros((3, b, t), np.int64)
  deltas = np.zeros((b,), np.int64)
  images = iter(grids)
  for row in range(b):
    real = tokens[row][mask[row]]
    is_image = real == config.image_token_id
    out = np.zeros((3, real.size), np.int64)
    i, pos = 0, 0
    while i < real.size:
      if not is_image[i]:
        out[:, i] = pos
        i, pos = i + 1, pos + 1
        continue
      grid = next(images, None)
      if grid is None:
        raise ValueError(f"row {row}: more image pad tokens than the {len(grids)} images given")
      _, h, w = grid
      mh, mw = h // m, w // m
      n = config.image_tokens(grid)
      if not is_image[i:i + n].all() or i + n > real.size:
        raise ValueError(f"row {row}: image of grid {tuple(grid)} needs {n} consecutive image "
                         f"pad tokens at token {i}")
      out[0, i:i + n] = pos
      out[1, i:i + n] = pos + np.repeat(np.arange(mh), mw)
      out[2, i:i + n] = pos + np.tile(np.arange(mw), mh)
      i, pos = i + n, pos + max(mh, mw)
    positions[:, row, mask[row]] = out
    deltas[row] = (out.max() + 1 if out.size else 0) - real.size
  if next(images, None) is not None:
    raise ValueError(f"{len(grids)} images given, fewer image pad runs in the tokens")
  return positions.astype(np.int32), deltas.astype(np.int32)


_tower = jax.jit(vision.tower, static_argnums=(1, 3))
# Images of one size per tower pass: a pass holds its images' activations (a 448 x 448 image on
# the 7B tower: ~0.1 GiB, its full-attention blocks' [16, 1024, 1024] scores the most), so a
# batch of many rows' images runs as a `lax.map` over passes of this many.
TOWER_IMAGES = 16


def image_features(params: VlParams, config: VlConfig, pixel_values, grids: Sequence[Grid]):
  """The vision tower's merged tokens [n, d] of every image (jitted per set of grid sizes):
  more than TOWER_IMAGES images of one size in passes of TOWER_IMAGES."""
  grids = tuple(tuple(int(v) for v in g) for g in grids)
  pixel_values = jnp.asarray(pixel_values)
  if len(grids) <= TOWER_IMAGES or len(set(grids)) > 1:
    return _tower(params.vision, config.vision, pixel_values, grids)
  return _tower_passes(params.vision, config.vision, pixel_values, grids[0], len(grids),
                       TOWER_IMAGES)


@functools.partial(jax.jit, static_argnums=(1, 3, 4, 5))
def _tower_passes(params: VisionParams, config: VisionConfig, pixel_values, grid: Grid, n: int,
                  k: int):
  """`vision.tower` over n images of one grid, k at a time (the last pass padded)."""
  patches, passes = pixel_values.shape[0] // n, -(-n // k)
  pad = passes * k * patches - pixel_values.shape[0]
  chunks = jnp.pad(pixel_values, ((0, pad), (0, 0))).reshape(passes, k * patches, -1)
  out = jax.lax.map(lambda x: vision.tower(params, config, x, (grid,) * k), chunks)
  return out.reshape(-1, out.shape[-1])[:n * patches // config.merge_unit]


def forward(params: VlParams, config: VlConfig, tokens, pixel_values=None,
            grids: Sequence[Grid] = (), attention_mask=None, cache=None, features=None,
            **kwargs):
  """Logits [b, t, v] (and the cache) of prompts with images.

  tokens: [b, t] with `config.image_tokens(grid)` image pad tokens per image (numpy: the image
    runs and positions are found on the host). pixel_values: [n, patch_dim] of all images in
    order (`vision.patchify`), grids their (1, h, w). attention_mask: left padding as
    `llm.forward`. cache: a `llm.KVCache` to prefill (positions [3, b, t]; decoding then goes on
    from each row's largest position + 1). features: `image_features` of these images, when
    already computed (pixel_values then unused). kwargs: `llm.forward`'s (last_only, ...)."""
  tokens = np.asarray(tokens)
  grids = [tuple(int(v) for v in g) for g in grids]
  n_pad = int((tokens == config.image_token_id).sum())
  need = sum(config.image_tokens(g) for g in grids)
  if n_pad != need:
    raise ValueError(f"{n_pad} image pad tokens in the prompt, the {len(grids)} images "
                     f"(grids {grids}) take {need}")
  if grids and features is None:
    features = image_features(params, config, pixel_values, grids)
  images = image_rows(params, config, tokens, grids, features, attention_mask)
  mask = None if attention_mask is None else jnp.asarray(attention_mask)
  tokens = jnp.asarray(tokens)
  return llm_model.forward(params.text, config.text, tokens, positions=images.streams,
                           attention_mask=mask, cache=cache,
                           embeds=embed_rows(params.text.embed, tokens, images), **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ImageRows:
  """A batch's image inputs to the decoder, every array row-major (a row selection, a
  micro-batch or a prompt's repeats split them as they split the tokens), the tower's tokens
  kept per row rather than as [b, t, d] embeddings (an executor row: 1024 image tokens in a
  32768-token context)."""

  features: jax.Array  # [b, k, d] each row's image tokens in prompt order (zero-padded)
  index: jax.Array  # [b, t] int32: the row's feature slot a token takes; -1: its own embedding
  positions: jax.Array  # [b, 3, t] int32: the rotary streams (`rope_index`)

  @property
  def streams(self) -> jax.Array:
    """The positions in `llm.forward`'s layout, [3, b, t]."""
    return jnp.moveaxis(self.positions, 1, 0)


@jax.jit
def embed_rows(embed, tokens, images: ImageRows):
  """The decoder's input embeddings [b, t, d]: each token's row of `embed`, an image pad
  token's its feature."""
  x = jnp.take(embed, tokens, axis=0)
  picked = jax.vmap(lambda f, i: jnp.take(f, i, axis=0))(images.features.astype(x.dtype),
                                                       jnp.maximum(images.index, 0))
  return jnp.where(images.index[..., None] >= 0, picked, x)


def image_rows(params: VlParams, config: VlConfig, tokens, grids: Sequence[Grid] = (),
               features=None, attention_mask=None) -> ImageRows:
  """The `ImageRows` of prompts (numpy tokens [b, t]) whose image pads stand, row after row, for
  the images of `grids` with tower tokens `features` ([n, d], `image_features`; None: no
  image). Feature slots per row: the most image tokens of a row, up to a power of two."""
  tokens = np.asarray(tokens)
  positions, _ = rope_index(tokens, config, grids, attention_mask)
  is_image = tokens == config.image_token_id
  counts = is_image.sum(axis=1)
  slots = 1 << max(0, int(counts.max()) - 1).bit_length()
  index = np.where(is_image, np.cumsum(is_image, axis=1) - 1, -1).astype(np.int32)
  if features is None:
    rows = jnp.zeros((tokens.shape[0], slots, params.text.embed.shape[1]), params.text.embed.dtype)
  else:
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    gather = np.minimum(starts[:, None] + np.arange(slots)[None], features.shape[0] - 1)
    filled = np.arange(slots)[None] < counts[:, None]
    rows = jnp.where(filled[..., None], jnp.take(features, jnp.asarray(gather), axis=0), 0)
  return ImageRows(features=rows, index=jnp.asarray(index),
                   positions=jnp.asarray(np.moveaxis(positions, 0, 1)))


def greedy(params: VlParams, config: VlConfig, tokens, pixel_values=None,
           grids: Sequence[Grid] = (), steps: int = 4, use_cache: bool = True,
           attention_mask=None) -> np.ndarray:
  """`steps` greedy tokens [b, steps] after prompts with images (no stop tokens; rows
  left-padded as `attention_mask` says). use_cache: one prefill into a `llm.KVCache`, then
  one-token decode steps, each row at its own position after its largest (its image offset);
  else a whole pass per token."""
  tokens = np.asarray(tokens)
  b, t = tokens.shape
  mask = np.ones((b, t), np.int32) if attention_mask is None else np.asarray(attention_mask)
  out = []
  if not use_cache:
    features = image_features(params, config, pixel_values, grids) if grids else None
    for _ in range(steps):
      logits, _ = forward(params, config, tokens, grids=grids, features=features,
                          attention_mask=mask)
      nxt = np.asarray(jnp.argmax(logits[:, -1], axis=-1)).astype(tokens.dtype)
      out.append(nxt)
      tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
      mask = np.concatenate([mask, np.ones((b, 1), mask.dtype)], axis=1)
    return np.stack(out, axis=1)
  cache = llm_model.init_cache(config.text, b, t + steps, params.text.embed.dtype)
  logits, cache = forward(params, config, tokens, pixel_values, grids, cache=cache,
                          attention_mask=mask, last_only=True)
  for i in range(steps):
    nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    out.append(np.asarray(nxt))
    if i + 1 < steps:
      logits, cache = llm_model.forward(params.text, config.text, nxt[:, None], cache=cache)
  return np.stack(out, axis=1)
