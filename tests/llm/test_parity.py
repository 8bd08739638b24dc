"""Numerical parity with transformers (PyTorch, CPU) on tiny random Llama, Qwen2 and Qwen3 models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm
from tests import tiny_models

FAMILIES = tiny_models.FAMILIES


@pytest.fixture(scope="module")
def loaded(hf_folders):
  return {f: llm.load(hf_folders[f][0]) for f in FAMILIES}


def torch_logits(model, tokens, attention_mask=None, position_ids=None):
  with torch.no_grad():
    kwargs = {}
    if attention_mask is not None:
      kwargs["attention_mask"] = torch.tensor(attention_mask)
    if position_ids is not None:
      kwargs["position_ids"] = torch.tensor(position_ids, dtype=torch.long)
    return model(torch.tensor(tokens, dtype=torch.long), **kwargs).logits.float().numpy()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_prefill_logits_match_transformers(family, seed, hf_folders, loaded):
  tokens = tiny_models.random_tokens(seed, (3, 17))
  ref = torch_logits(hf_folders[family][1], tokens)
  model = loaded[family]
  ours, _ = llm.forward(model.params, model.config, jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_rows_match_transformers(family, hf_folders, loaded):
  """Padding is excluded by the mask and skipped by the positions, as transformers does it."""
  tokens = tiny_models.random_tokens(3, (3, 12))
  mask = np.ones_like(tokens)
  mask[0, :5] = 0
  mask[1, :2] = 0
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  ref = torch_logits(hf_folders[family][1], tokens, mask, positions)
  model = loaded[family]
  ours, _ = llm.forward(model.params, model.config, jnp.asarray(tokens),
                        attention_mask=jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours)[real], ref[real], atol=1e-4, rtol=0)
  # A padded row gives the same logits as the same prompt alone, unpadded.
  alone, _ = llm.forward(model.params, model.config, jnp.asarray(tokens[:1, 5:]))
  np.testing.assert_allclose(np.asarray(ours)[0, 5:], np.asarray(alone)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decode_equals_full_sequence(family, loaded):
  model = loaded[family]
  tokens = tiny_models.random_tokens(4, (2, 14))
  mask = np.ones_like(tokens)
  mask[1, :3] = 0
  full, _ = llm.forward(model.params, model.config, jnp.asarray(tokens),
                        attention_mask=jnp.asarray(mask))
  cache = llm.init_cache(model.config, batch=2, max_len=32)
  prefix = 9
  logits, cache = llm.forward(model.params, model.config, jnp.asarray(tokens[:, :prefix]),
                              attention_mask=jnp.asarray(mask[:, :prefix]), cache=cache)
  steps = [logits]
  for i in range(prefix, tokens.shape[1]):
    logits, cache = llm.forward(model.params, model.config, jnp.asarray(tokens[:, i:i + 1]),
                                cache=cache)
    steps.append(logits)
  incremental = np.concatenate([np.asarray(s) for s in steps], axis=1)
  real = mask.astype(bool)
  np.testing.assert_allclose(incremental[real], np.asarray(full)[real], atol=1e-5, rtol=0)
  assert int(cache.length) == tokens.shape[1]
  np.testing.assert_array_equal(np.asarray(cache.next_pos), mask.sum(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_equals_transformers_generate(family, hf_folders, loaded):
  torch_model = hf_folders[family][1]
  model = loaded[family]
  prompts = [tiny_models.random_tokens(10 + i, (n,)).tolist() for i, n in enumerate((4, 9, 13))]
  ours = llm.sample(model, prompts, llm.GenerationSettings(24, llm.GREEDY),
                    rng=jax.random.key(0))
  for row, prompt in enumerate(prompts):
    with torch.no_grad():
      ref = torch_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    np.testing.assert_array_equal(ours.tokens[row], ref[0, len(prompt):].numpy())
  assert (ours.lengths == 24).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_load_gives_identical_logits(family, loaded, tmp_path):
  model = loaded[family]
  llm.save(model, str(tmp_path))
  again = llm.load(str(tmp_path))
  assert again.config == model.config
  tokens = jnp.asarray(tiny_models.random_tokens(5, (2, 10)))
  a, _ = llm.forward(model.params, model.config, tokens)
  b, _ = llm.forward(again.params, again.config, tokens)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert again.tokenizer is not None and again.stop_ids == model.stop_ids


def test_saved_folder_loads_in_transformers(loaded, tmp_path, hf_folders):
  """Our writer produces a folder transformers reads back to the same model."""
  from transformers import AutoModelForCausalLM

  llm.save(loaded["llama"], str(tmp_path))
  reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  tokens = tiny_models.random_tokens(6, (2, 11))
  np.testing.assert_allclose(torch_logits(reloaded, tokens),
                             torch_logits(hf_folders["llama"][1], tokens), atol=1e-6, rtol=0)


def test_bfloat16_weights_track_float32(hf_folders):
  folder = hf_folders["qwen3"][0]
  f32, bf16 = llm.load(folder), llm.load(folder, dtype=jnp.bfloat16)
  assert bf16.params.layers.wq.dtype == jnp.bfloat16
  tokens = jnp.asarray(tiny_models.random_tokens(7, (2, 10)))
  a, _ = llm.forward(f32.params, f32.config, tokens)
  b, _ = llm.forward(bf16.params, bf16.config, tokens)
  assert b.dtype == jnp.float32
  scale = float(jnp.abs(a).max())
  assert float(jnp.abs(a - b).max()) < 0.1 * scale
  # Mostly the same top token despite bf16 rounding.
  assert float(jnp.mean(jnp.argmax(a, -1) == jnp.argmax(b, -1))) > 0.8
