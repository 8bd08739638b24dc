"""Tiny random transformers models and tokenizers, made locally with no download."""

from __future__ import annotations

import json
import os

import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3")
VOCAB = 96

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def hf_config(family: str, **overrides):
  from transformers import LlamaConfig, Qwen2Config, Qwen3Config

  common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False,
                max_position_embeddings=256)
  if family == "llama":
    common.update(rope_theta=500000.0, attention_bias=True,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=32))
    return LlamaConfig(**{**common, **overrides})
  if family == "qwen2":
    return Qwen2Config(**{**common, "tie_word_embeddings": True, **overrides})
  if family == "qwen3":
    return Qwen3Config(**{**common, "head_dim": 16, "rope_theta": 1e6, **overrides})
  raise ValueError(family)


def make_torch_model(family: str, seed: int = 0, **overrides):
  """A random model with norms and biases randomised too, so that they are really checked."""
  import torch
  from transformers import AutoModelForCausalLM

  torch.manual_seed(seed)
  model = AutoModelForCausalLM.from_config(hf_config(family, **overrides)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(torch.randn_like(p) * 0.3)
  return model


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE):
  """A word-level tokenizer over a fixed vocabulary of VOCAB ids, with special tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = [f"w{i}" for i in range(VOCAB - len(SPECIAL) - 1)]
  vocab = {tok: i for i, tok in enumerate(SPECIAL + ["<unk>"] + words)}
  core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|end|>",
                                unk_token="<unk>", additional_special_tokens=SPECIAL[2:])
  if chat_template is not None:
    tok.chat_template = chat_template
  return tok


def save_hf_model(family: str, folder: str, with_tokenizer: bool = True, **overrides):
  model = make_torch_model(family, **overrides)
  model.save_pretrained(folder)
  if with_tokenizer:
    make_tokenizer().save_pretrained(folder)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [1, 7], "pad_token_id": 0}, f)
  return folder, model


def random_tokens(seed: int, shape) -> np.ndarray:
  return np.random.RandomState(seed).randint(5, VOCAB, shape).astype(np.int32)


# ChatML with tool messages and `enable_thinking` in the manner of Qwen3's template.
BYTES_TEMPLATE = (
    "{% for m in messages %}<|im_start|>"
    "{% if m['role'] == 'tool' %}user\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% else %}{{ m['role'] }}\n{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}")
BYTES_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]  # not special


def make_byte_tokenizer():
  """A byte-level BPE without merges (an id per byte, so any text has a spelling, as in real BPE
  tokenizers) with ChatML's special tokens and, as Qwen's, added tokens that are not special."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
  core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  core.decoder = decoders.ByteLevel()
  tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                pad_token="<|endoftext|>",
                                additional_special_tokens=["<|im_start|>"])
  tok.add_tokens(BYTES_ADDED)
  tok.chat_template = BYTES_TEMPLATE
  return tok


# Qwen2.5-VL: a tiny vision tower (head_dim 16, 3 blocks, block 1 full attention, Qwen2.5-VL's
# 112 px windows) in front of a tiny Qwen2 text model (head_dim 16, mrope_section 2 / 3 / 3).
VL_VOCAB = 128
VL_TOKENS = dict(image_token_id=120, video_token_id=121, vision_start_token_id=122,
                 vision_end_token_id=123)


def vl_hf_config(vocab_size: int = VL_VOCAB, tokens: dict = VL_TOKENS, **vision_overrides):
  from transformers import Qwen2_5_VLConfig

  text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              bos_token_id=None, eos_token_id=None, initializer_range=0.2,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                   mrope_section=[2, 3, 3]))
  vis = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
             window_size=112, fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2,
             temporal_patch_size=2, initializer_range=0.2, **vision_overrides)
  return Qwen2_5_VLConfig(text_config=text, vision_config=vis, initializer_range=0.2,
                          **tokens)


def make_torch_vl_model(seed: int = 0, config=None, **vision_overrides):
  """A random Qwen2_5_VLForConditionalGeneration, norms and biases randomised too."""
  import torch
  from transformers import Qwen2_5_VLForConditionalGeneration

  torch.manual_seed(seed)
  config = config or vl_hf_config(**vision_overrides)
  model = Qwen2_5_VLForConditionalGeneration(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "ln_q" in name or "bias" in name:
        p.add_(torch.randn_like(p) * 0.3)
  return model


def save_hf_vl_model(folder: str, seed: int = 0, **vision_overrides):
  model = make_torch_vl_model(seed, **vision_overrides)
  model.save_pretrained(folder)
  return folder, model


# Qwen2.5-VL-7B-Instruct's chat template (tokenizer_config.json), its video branch and
# add_vision_id left out: an image part is <|vision_start|><|image_pad|><|vision_end|>.
VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_hf_vl_chat_model(folder: str, seed: int = 0) -> str:
  """A tiny random Qwen2.5-VL folder with a chat tokenizer (the byte tokenizer, Qwen2.5-VL's
  vision tokens and image template): what the chat server loads."""
  tok = make_byte_tokenizer()
  names = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
  tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *names]})
  tok.chat_template = VL_TEMPLATE
  ids = tok.convert_tokens_to_ids(list(names))
  tokens = dict(vision_start_token_id=ids[0], image_token_id=ids[1], vision_end_token_id=ids[2],
                video_token_id=ids[3])
  config = vl_hf_config(vocab_size=len(tok), tokens=tokens)
  config.eos_token_id = tok.eos_token_id
  make_torch_vl_model(seed, config).save_pretrained(folder)
  tok.save_pretrained(folder)
  return folder
