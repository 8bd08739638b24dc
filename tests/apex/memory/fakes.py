"""Tiny deterministic embedders for the memory tests (no model, no randomness across runs)."""

from __future__ import annotations

import hashlib
import re
from typing import Mapping, Sequence

import numpy as np


class HashEmbedder:
  """Hashed bag of words: each lower-cased word adds +-1 to one of `dim` coordinates (md5, so
  the same on every run and process). Texts with the same words get the same vector."""

  def __init__(self, dim: int = 32):
    self.dim = dim
    self.calls = 0

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    self.calls += 1
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, text in enumerate(texts):
      for word in re.findall(r"\w+", text.lower()):
        h = int(hashlib.md5(word.encode()).hexdigest(), 16)
        out[i, h % self.dim] += 1.0 if (h >> 64) & 1 else -1.0
    return out


class TableEmbedder:
  """Looks each text up in a table of hand-picked vectors (unknown text: a KeyError)."""

  def __init__(self, table: Mapping[str, Sequence[float]]):
    self.table = {k: np.asarray(v, np.float32) for k, v in table.items()}

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    return np.stack([self.table[t] for t in texts])
