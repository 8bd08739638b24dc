"""Tokenizer from a local Hugging Face folder or GGUF file: transformers AutoTokenizer, never a
download."""

from __future__ import annotations

import json
import os
from typing import Sequence

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TokenizerError(ValueError):
  """The tokenizer files are unusable; the message names the file or field."""


class Tokenizer:
  """A thin wrapper that keeps the folder (or .gguf file) it came from for error messages."""

  def __init__(self, hf_tokenizer, path: str):
    self.hf = hf_tokenizer
    self.path = path

  @property
  def pad_id(self) -> int:
    if self.hf.pad_token_id is not None:
      return self.hf.pad_token_id
    return self.hf.eos_token_id if self.hf.eos_token_id is not None else 0

  @property
  def eos_id(self) -> int | None:
    return self.hf.eos_token_id

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self.hf.encode(text, add_special_tokens=add_special_tokens)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                          **kwargs) -> list[int]:
    """Token ids of a chat; raises TokenizerError when the folder defines no chat template."""
    if not getattr(self.hf, "chat_template", None):
      where = (f"{self.path}: the GGUF file has no 'tokenizer.chat_template' field"
               if os.path.isfile(self.path) else
               f"{os.path.join(self.path, 'tokenizer_config.json')}: the tokenizer has no "
               "'chat_template' field")
      raise TokenizerError(f"{where}, so chat messages cannot be rendered")
    out = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                      tokenize=True, **kwargs)
    # transformers 5 returns a BatchEncoding from tokenize=True; older versions a list.
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)

  def save(self, path: str) -> None:
    self.hf.save_pretrained(path)


def load_tokenizer(path: str) -> Tokenizer | None:
  """Loads the tokenizer in `path`, or returns None when the folder has no tokenizer files."""
  if not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
    return None
  from transformers import AutoTokenizer  # deferred: transformers is slow to import

  try:
    hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
  except Exception as e:  # transformers raises many types; keep the cause, name the folder
    raise TokenizerError(f"{path}: could not load the tokenizer: {e}") from e
  return Tokenizer(hf, path)


def stop_ids(path: str, tokenizer: Tokenizer | None) -> tuple[int, ...]:
  """EOS ids from the folder's generation_config.json (int or list), plus the tokenizer's EOS."""
  gen = None
  gen_path = os.path.join(path, "generation_config.json")
  if os.path.exists(gen_path):
    try:
      with open(gen_path) as f:
        gen = json.load(f)
    except json.JSONDecodeError as e:
      raise TokenizerError(f"{gen_path}: not valid JSON: {e}") from e
  return stop_ids_from(gen, tokenizer, gen_path)


def stop_ids_from(generation_config: dict | None, tokenizer: Tokenizer | None,
                  source: str) -> tuple[int, ...]:
  """EOS ids of a generation config dict (int or list), plus the tokenizer's EOS; `source` names
  where the dict came from in errors."""
  ids: list[int] = []
  eos = (generation_config or {}).get("eos_token_id")
  if isinstance(eos, int):
    ids.append(eos)
  elif isinstance(eos, list) and all(isinstance(i, int) for i in eos):
    ids.extend(eos)
  elif eos is not None:
    raise TokenizerError(f"{source}: eos_token_id must be an int or a list of ints, got {eos!r}")
  if tokenizer is not None and tokenizer.eos_id is not None and tokenizer.eos_id not in ids:
    ids.append(tokenizer.eos_id)
  return tuple(ids)
