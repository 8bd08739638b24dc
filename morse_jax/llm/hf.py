"""Hugging Face folders in and out: config.json, (sharded) safetensors, tokenizer, generation config.
`load` also takes a `.gguf` file (gguf.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from morse_jax.llm.config import ConfigError, LlmConfig
from morse_jax.llm.params import LayerParams, Params, param_shapes
from morse_jax.llm.tokenizer import Tokenizer, load_tokenizer, stop_ids

# field -> Hugging Face tensor name ({i}: layer). Our layout is theirs ([out, in]): no transposes.
_LAYER_NAMES = {
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj.weight",
    "wk": "model.layers.{i}.self_attn.k_proj.weight",
    "wv": "model.layers.{i}.self_attn.v_proj.weight",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "bq": "model.layers.{i}.self_attn.q_proj.bias",
    "bk": "model.layers.{i}.self_attn.k_proj.bias",
    "bv": "model.layers.{i}.self_attn.v_proj.bias",
    "bo": "model.layers.{i}.self_attn.o_proj.bias",
    "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "w_gate": "model.layers.{i}.mlp.gate_proj.weight",
    "w_up": "model.layers.{i}.mlp.up_proj.weight",
    "w_down": "model.layers.{i}.mlp.down_proj.weight",
}
_TOP_NAMES = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
              "lm_head": "lm_head.weight"}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
SHARD_BYTES = 2 * 1024**3


class CheckpointError(ValueError):
  """A checkpoint tensor or index is missing or malformed; the message names file and tensor."""


@dataclasses.dataclass
class Model:
  config: LlmConfig
  params: Params
  tokenizer: Tokenizer | None = None
  stop_ids: tuple[int, ...] = ()
  hf_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # raw, kept for save
  generation_config: dict[str, Any] | None = None


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: file not found")
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path}: not valid JSON: {e}") from e


def _weight_files(path: str) -> dict[str, str]:
  """Tensor name -> file, from model.safetensors or the sharded index."""
  index_path = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index_path):
    index = _read_json(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index_path}: field 'weight_map' is missing or not an object")
    files = {name: os.path.join(path, f) for name, f in weight_map.items()}
    for f in sorted(set(files.values())):
      if not os.path.exists(f):
        raise FileNotFoundError(f"{f}: shard named in {index_path} not found")
    return files
  if os.path.exists(single):
    with safe_open(single, framework="numpy") as f:
      return {name: single for name in f.keys()}
  raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


class _TensorReader:
  """Reads named tensors lazily, opening the shard for each one: an open handle memory-maps its
  file, and every page read through it stays in the process's resident set while it is open (a
  3.5 GB checkpoint read through open handles peaked at weights + file = 8.5 GB resident)."""

  def __init__(self, files: dict[str, str]):
    self.files = files

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.files:
      raise CheckpointError(f"tensor {name!r} is missing from the checkpoint")
    file = self.files[name]
    try:
      with safe_open(file, framework="numpy") as handle:
        array = handle.get_tensor(name)
    except Exception as e:  # safetensors raises its own error types
      raise CheckpointError(f"{file}: cannot read tensor {name!r}: {e}") from e
    if tuple(array.shape) != tuple(shape):
      raise CheckpointError(f"{file}: tensor {name!r} has shape {tuple(array.shape)}, "
                            f"expected {tuple(shape)} from config.json")
    return array



def load(path: str, dtype=None) -> Model:
  """Loads a local Hugging Face folder (Llama 3.x, Qwen2/2.5, Qwen3); `loader.load` also takes a
  `.gguf` file.

  dtype: weights dtype; default the config's `dtype`/`torch_dtype` when float32/bfloat16/float16,
  else float32.
  """
  path = os.path.abspath(os.path.expanduser(path))
  config_path = os.path.join(path, "config.json")
  hf_config = _read_json(config_path)
  config = LlmConfig.from_hf_dict(hf_config, source=config_path)
  if dtype is None:
    dtype = _DTYPES.get(str(hf_config.get("dtype") or hf_config.get("torch_dtype")), jnp.float32)
  params = assemble_params(config, dtype, _TensorReader(_weight_files(path)).get)
  tokenizer = load_tokenizer(path)
  gen_path = os.path.join(path, "generation_config.json")
  generation_config = _read_json(gen_path) if os.path.exists(gen_path) else None
  return Model(config=config, params=params, tokenizer=tokenizer,
               stop_ids=stop_ids(path, tokenizer), hf_config=hf_config,
               generation_config=generation_config)


def assemble_params(config: LlmConfig, dtype, get: Callable[[str, tuple[int, ...]], np.ndarray]
                    ) -> Params:
  """Our Params from `get(hf_tensor_name, expected_shape)`, which returns that tensor as numpy
  (shape-checked, errors naming its file); one tensor at a time, layers stacked per field.

  Each layer's tensor is cast into a preallocated stacked array of `dtype`, so loading holds the
  weights plus one field in `dtype` and one layer as read (a GGUF's float32 dequantization),
  not a whole field in float32 as well (1.5 GB more for Qwen2.5-1.5B's MLP fields)."""
  shapes = param_shapes(config)
  np_dtype = np.dtype(dtype)  # jnp.bfloat16 is ml_dtypes' numpy bfloat16

  def top(field):
    return jnp.asarray(get(_TOP_NAMES[field], getattr(shapes, field)).astype(np_dtype, copy=False))

  layer_fields = {}
  for field, template in _LAYER_NAMES.items():
    shape = getattr(shapes.layers, field)
    if shape is None:
      layer_fields[field] = None
      continue
    stacked = np.empty(shape, np_dtype)
    for i in range(config.num_layers):
      stacked[i] = get(template.format(i=i), shape[1:])
    layer_fields[field] = jnp.asarray(stacked)
    del stacked
  return Params(embed=top("embed"), layers=LayerParams(**layer_fields),
                final_norm=top("final_norm"),
                lm_head=None if config.tie_word_embeddings else top("lm_head"))


def hf_tensors(params: Params, config: LlmConfig) -> dict[str, np.ndarray]:
  """Our params as a flat dict of Hugging Face tensor names -> numpy arrays."""
  out: dict[str, np.ndarray] = {}
  host = jax.device_get(params)
  for field, name in _TOP_NAMES.items():
    array = getattr(host, field)
    if array is not None:
      out[name] = np.ascontiguousarray(array)
  for field, template in _LAYER_NAMES.items():
    stacked = getattr(host.layers, field)
    if stacked is None:
      continue
    for i in range(config.num_layers):
      out[template.format(i=i)] = np.ascontiguousarray(stacked[i])
  return out


def _atomic_write_json(obj, path: str) -> None:
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def save(model: Model, path: str, max_shard_bytes: int = SHARD_BYTES) -> None:
  """Writes the Hugging Face layout (each file written to a temp name, then renamed)."""
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  tensors = hf_tensors(model.params, model.config)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, array in tensors.items():
    if shards[-1] and size + array.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  names = (["model.safetensors"] if len(shards) == 1 else
           [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
  for shard, name in zip(shards, names):
    tmp = os.path.join(path, name + ".tmp")
    save_file(shard, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, name))
  index_path = os.path.join(path, "model.safetensors.index.json")
  if len(shards) > 1:
    weight_map = {t: n for shard, n in zip(shards, names) for t in shard}
    _atomic_write_json({"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
                        "weight_map": weight_map}, index_path)
  elif os.path.exists(index_path):
    os.remove(index_path)
  dtype = str(jnp.dtype(model.params.embed.dtype))
  hf_config = {**model.hf_config, **model.config.to_hf_dict(), "dtype": dtype}
  hf_config.pop("rope_theta", None)  # the new layout keeps it under rope_parameters
  hf_config.pop("rope_scaling", None)
  hf_config.pop("torch_dtype", None)
  _atomic_write_json(hf_config, os.path.join(path, "config.json"))
  if model.generation_config is not None:
    _atomic_write_json(model.generation_config, os.path.join(path, "generation_config.json"))
  if model.tokenizer is not None:
    model.tokenizer.save(path)
