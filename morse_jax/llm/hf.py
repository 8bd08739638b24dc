"""Hugging Face folders in and out: config.json, (sharded) safetensors, tokenizer, generation config.
`load` also takes a `.gguf` file (gguf.py)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from morse_jax.llm.bundle import Model
from morse_jax.llm.config import ConfigError, LlmConfig
from morse_jax.llm.params import Params, Weight, declared
from morse_jax.llm.tokenizer import load_tokenizer, stop_ids

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
SHARD_BYTES = 2 * 1024**3


class CheckpointError(ValueError):
  """A checkpoint tensor or index is missing or malformed; the message names file and tensor."""


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
  reader = _TensorReader(_weight_files(path))
  params = assemble_params(config, dtype,
                           lambda w, layer, shape: reader.get(w.hf.format(i=layer), shape))
  tokenizer = load_tokenizer(path)
  gen_path = os.path.join(path, "generation_config.json")
  generation_config = _read_json(gen_path) if os.path.exists(gen_path) else None
  return Model(config=config, params=params, tokenizer=tokenizer,
               stop_ids=stop_ids(path, tokenizer), hf_config=hf_config,
               generation_config=generation_config)


def assemble_params(config: LlmConfig, dtype,
                    read: Callable[[Weight, int | None, tuple[int, ...]], np.ndarray]) -> Params:
  """Our Params from `read(weight, layer, expected_shape)`, which returns one tensor (of layer
  `layer` of a stacked weight, else None) as numpy, shape-checked, errors naming its file; one
  tensor at a time, layers stacked per field, every tensor `llm.params.WEIGHTS` declares.

  Each layer's tensor is cast into a preallocated stacked array of `dtype`, so loading holds the
  weights plus one field in `dtype` and one layer as read (a GGUF's float32 dequantization),
  not a whole field in float32 as well (1.5 GB more for Qwen2.5-1.5B's MLP fields)."""
  np_dtype = np.dtype(dtype)  # jnp.bfloat16 is ml_dtypes' numpy bfloat16

  def build(weight: Weight) -> jax.Array:
    shape = weight.shape(config)
    if not weight.stacked:
      return jnp.asarray(read(weight, None, shape).astype(np_dtype, copy=False))
    stacked = np.empty(shape, np_dtype)
    for i in range(config.num_layers):
      stacked[i] = read(weight, i, shape[1:])
    return jnp.asarray(stacked)

  return jax.tree.map(build, declared(config))


def hf_tensors(params: Params, config: LlmConfig) -> dict[str, np.ndarray]:
  """Our params as a flat dict of Hugging Face tensor names -> numpy arrays."""
  return named_tensors(declared(config), params, config.num_layers)


def named_tensors(weights, params, layers: int) -> dict[str, np.ndarray]:
  """A params tree as Hugging Face tensor names -> numpy arrays, by its tree of `Weight`
  declarations (a stacked weight: one tensor per layer, "{i}" in its name)."""
  out: dict[str, np.ndarray] = {}

  def add(weight: Weight, array) -> None:
    if not weight.stacked:
      out[weight.hf] = np.ascontiguousarray(array)
      return
    for i in range(layers):
      out[weight.hf.format(i=i)] = np.ascontiguousarray(array[i])

  jax.tree.map(add, weights, jax.device_get(params))
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
