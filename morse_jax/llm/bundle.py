"""`Model`: what travels together once a backbone is loaded (config, weights, tokenizer, stop ids),
passed whole to the sampler, the trainers and the agents.

It lives beside the forward pass, not in it: `model.py` is array code that every jitted program
imports, while a `Model` also holds host objects (the tokenizer, the raw Hugging Face dicts that
`hf.save` writes back). hf.py, gguf.py and loader.py build it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.params import Params
from morse_jax.llm.tokenizer import Tokenizer


@dataclasses.dataclass
class Model:
  config: LlmConfig
  params: Params
  tokenizer: Tokenizer | None = None
  stop_ids: tuple[int, ...] = ()
  hf_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # raw, kept for save
  generation_config: dict[str, Any] | None = None

  @property
  def pad_id(self) -> int:
    """The tokenizer's pad id (0 without a tokenizer): what the sampler writes after a stop and
    the update pads rows with."""
    return 0 if self.tokenizer is None else self.tokenizer.pad_id
