"""`load`: a model from a Hugging Face folder (hf.py) or a `.gguf` file (gguf.py)."""

from __future__ import annotations

import os

from morse_jax.llm import gguf, hf
from morse_jax.llm.bundle import Model


def load(path: str, dtype=None) -> Model:
  """Loads a local Hugging Face folder or a `.gguf` file of Llama 3.x, Qwen2/2.5 or Qwen3.

  dtype: weights dtype; default the config's `dtype`/`torch_dtype` when float32/bfloat16/float16,
  else float32 (a GGUF file: float32, the dequantized values' type).
  """
  path = os.path.abspath(os.path.expanduser(path))
  if path.endswith(".gguf") and not os.path.isdir(path):
    return gguf.load(path, dtype=dtype)
  return hf.load(path, dtype=dtype)
