"""Qwen2.5-Coder-1.5B-Instruct (`make real-model-qwen`, Q4_K_M GGUF): our reading of the file
against transformers' reading of the same file, in float32 -- the Qwen2 specifics the SmolLM2 test
cannot show: biases on q / k / v, a 151,936-token vocabulary, an untied lm_head, the
`<|im_start|>` chat template, EOS 151645.

Slow (each side reads 1.78B parameters; ~7 GB in float32), so the two float32 models are never
alive together: transformers' logits and greedy tokens are computed first and its model freed,
then ours is read from the .gguf directly (`llm.load(x.gguf)`). The process still peaked at
13.4 GB resident (freed torch memory is not all returned; 57 min on a loaded 2-core machine).
Skips when the file is absent.
"""

import gc
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm
from morse_jax.llm import gguf

pytestmark = pytest.mark.slow

FOLDER = os.path.expanduser("~/.cache/morse_jax/models/Qwen2.5-Coder-1.5B-Instruct")
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Write a Python function is_even(n)."}],
]
NEW_TOKENS = 24
EOS = 151645  # <|im_end|>
# Measured max |ours - transformers| over the CHATS' prompt logits (XLA:CPU vs PyTorch float32):
# 2.36e-4 (per chat 2.36e-4, 4.7e-5). About five times that:
LOGIT_ATOL = 1.2e-3


def _gguf_path() -> str:
  try:
    return gguf.resolve("qwen25_coder_15b")
  except FileNotFoundError as e:
    pytest.skip(f"the Qwen model is not fetched (make real-model-qwen): {e}")


@pytest.fixture(scope="module")
def ref():
  """transformers on the file: its logits, greedy tokens, tokenizer and generation eos; the model
  itself is freed before ours is read."""
  from transformers import AutoModelForCausalLM, AutoTokenizer

  path = _gguf_path()
  folder, file = os.path.split(path)
  tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
  prompts = [list(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]) for c in CHATS]
  model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
  width = max(len(p) for p in prompts)
  pad = tokenizer.pad_token_id
  tokens = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
  with torch.no_grad():
    logits = [model(torch.tensor([p])).logits[0].numpy() for p in prompts]
    generated = model.generate(tokens, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=EOS, pad_token_id=pad)
  greedy = []
  for row in generated[:, width:].tolist():
    greedy.append(row[:row.index(EOS) + 1] if EOS in row else row)
  out = types.SimpleNamespace(path=path, tokenizer=tokenizer, prompts=prompts, logits=logits,
                              greedy=greedy, config=model.config.to_dict(),
                              generation_eos=model.generation_config.eos_token_id,
                              state={k: model.state_dict()[k].numpy().copy() for k in (
                                  "model.layers.0.self_attn.q_proj.bias", "lm_head.weight",
                                  "model.embed_tokens.weight",
                                  "model.layers.27.mlp.down_proj.weight")})
  del model, generated
  gc.collect()
  return out


@pytest.fixture(scope="module")
def ours(ref):
  return llm.load(ref.path)  # the .gguf itself, float32


def test_config_is_qwen2_with_biases_untied_head_and_the_large_vocabulary(ref, ours):
  c = ours.config
  assert c == llm.LlmConfig.from_hf_dict(ref.config)
  assert (c.model_type, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size,
          c.qkv_bias, c.tie_word_embeddings) == ("qwen2", 28, 1536, 12, 2, 151936, True, False)
  assert ours.params.lm_head is not None and ours.params.layers.bq is not None
  assert 1.77e9 < c.num_params() < 1.78e9
  tensors = llm.hf.hf_tensors(ours.params, c)
  for name, array in ref.state.items():  # same dequantizer: bit-equal
    np.testing.assert_array_equal(tensors[name], array, err_msg=name)


def test_logits_equal_transformers(ref, ours):
  width = max(len(p) for p in ref.prompts)
  pad = ours.tokenizer.pad_id
  tokens = np.array([[pad] * (width - len(p)) + p for p in ref.prompts], np.int32)
  mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in ref.prompts], np.int32)
  logits, _ = llm.forward(ours.params, ours.config, jnp.asarray(tokens),
                          attention_mask=jnp.asarray(mask))
  logits = np.asarray(logits)
  diffs = []
  for row, (p, expected) in enumerate(zip(ref.prompts, ref.logits)):
    got = logits[row, width - len(p):]
    diffs.append(float(np.abs(got - expected).max()))
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
  print(f"max |logits ours - transformers| per prompt: {diffs}")
  assert max(diffs) < LOGIT_ATOL


def test_greedy_generation_equals_transformers_generate(ref, ours):
  out = llm.sample(ours, ref.prompts, llm.GenerationSettings.for_model(
      ours, NEW_TOKENS, llm.GREEDY, unstack=False), rng=jax.random.key(0))
  for row, expected in enumerate(ref.greedy):
    got = out.tokens[row, :out.lengths[row]].tolist()
    assert got == expected, (f"chat {row}: ours {ours.tokenizer.decode(got)!r} vs transformers "
                             f"{ours.tokenizer.decode(expected)!r}")
    assert len(got) >= 6
  assert "Paris" in ours.tokenizer.decode(out.tokens[0, :out.lengths[0]])


def test_chat_template_and_stop_ids(ref, ours):
  tok = ours.tokenizer
  for chat, expected in zip(CHATS, ref.prompts):
    assert tok.apply_chat_template(chat, add_generation_prompt=True) == expected
  assert tok.decode(ref.prompts[1], skip_special_tokens=False) == (
      "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
      "<|im_start|>user\nWrite a Python function is_even(n).<|im_end|>\n<|im_start|>assistant\n")
  assert tok.decode(ref.prompts[0], skip_special_tokens=False).startswith(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
  assert ours.stop_ids[0] == EOS == ref.generation_eos
  assert tok.decode([EOS], skip_special_tokens=False) == "<|im_end|>"


def test_the_converted_bfloat16_folder_holds_the_file_weights(ref, ours):
  """`make real-model-qwen`'s folder: the file's weights rounded to bfloat16, same config and
  tokenizer (read tensor by tensor: a second whole model would not fit beside this one)."""
  from safetensors import safe_open

  if not os.path.isdir(FOLDER):
    pytest.skip(f"{FOLDER} is absent: make real-model-qwen writes it")
  folder = llm.hf._weight_files(FOLDER)
  tensors = llm.hf.hf_tensors(ours.params, ours.config)
  for name in ref.state:
    with safe_open(folder[name], framework="numpy") as f:
      stored = f.get_tensor(name)
    assert stored.dtype == jnp.bfloat16
    np.testing.assert_array_equal(stored, tensors[name].astype(jnp.bfloat16), err_msg=name)
  config = llm.LlmConfig.from_hf_dict(llm.hf._read_json(os.path.join(FOLDER, "config.json")))
  assert config == ours.config
  assert llm.tokenizer.load_tokenizer(FOLDER).apply_chat_template(CHATS[1]) == ref.prompts[1]
