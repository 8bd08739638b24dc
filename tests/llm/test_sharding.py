"""Meshes 8x1, 4x2 and 2x4 on fake CPU devices give one device's logits and sampled tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from morse_jax import llm
from morse_jax.llm import sharding
from tests import tiny_models

# 8 heads / 4 kv heads / mlp 128 / vocab 96: every model axis size used here divides them.
CONFIG = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=8, num_kv_heads=4, head_dim=16, qk_norm=True,
                       qkv_bias=True)
MESHES = [(8, 1), (4, 2), (2, 4)]


@pytest.fixture(scope="module")
def reference():
  params = llm.init_random(CONFIG, jax.random.key(0), scale=0.2, norm_jitter=0.2)
  tokens = tiny_models.random_tokens(0, (8, 12))
  mask = np.ones_like(tokens)
  mask[3, :4] = 0
  logits, _ = llm.forward(params, CONFIG, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  prompts = [tiny_models.random_tokens(i, (3 + i,)).tolist() for i in range(8)]
  sampling = llm.SamplingConfig(temperature=1.0, top_p=0.9)
  out = llm.sample(llm.Model(CONFIG, params), prompts, llm.GenerationSettings(12, sampling),
                   rng=jax.random.key(1))
  return params, tokens, mask, np.asarray(logits), prompts, sampling, out


def test_rules_map_logical_axes(eight_devices):
  mesh = sharding.make_mesh(2, 4)
  rules = sharding.ShardingRules()
  assert rules.spec(("layers", "heads", "embed"), (2, 128, 64), mesh) == P(None, "model", None)
  assert rules.spec(("batch", None), (8, 3), mesh) == P("data", None)
  # 3 kv heads do not split over 4 devices: replicated rather than an error.
  assert rules.spec(("kv_heads",), (3,), mesh) == P(None)
  with pytest.raises(ValueError, match="unknown logical axis 'hidden'"):
    rules.spec(("hidden",), (4,), mesh)
  with pytest.raises(ValueError, match="ShardingRules.mlp = 'tensor'"):
    sharding.ShardingRules(mlp="tensor").spec(("mlp",), (8,), mesh)
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh(4, 4)


@pytest.mark.parametrize("data,model", MESHES)
def test_sharded_logits_and_samples_equal_one_device(data, model, reference, eight_devices):
  params, tokens, mask, ref_logits, prompts, sampling, ref_out = reference
  mesh = sharding.make_mesh(data, model)
  sharded = sharding.shard_params(params, mesh)
  assert sharded.layers.w_gate.sharding.spec == P(None, "model", None)
  place = sharding.shard_rows(mesh)
  tok, msk = place(jnp.asarray(tokens), jnp.asarray(mask))
  logits, _ = llm.forward(sharded, CONFIG, tok, attention_mask=msk)
  assert logits.sharding.spec[0] == "data"
  np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=1e-5, rtol=1e-5)
  out = llm.sample(llm.Model(CONFIG, sharded), prompts, llm.GenerationSettings(12, sampling),
                   rng=jax.random.key(1), mesh=mesh)
  np.testing.assert_array_equal(out.tokens, ref_out.tokens)
  np.testing.assert_allclose(out.logprobs, ref_out.logprobs, atol=1e-5)


def test_cache_shardings_follow_rules(eight_devices):
  mesh = sharding.make_mesh(2, 4)
  cache = llm.init_cache(CONFIG, batch=4, max_len=16)
  specs = sharding.cache_shardings(cache, mesh)
  assert specs.k.spec == P(None, "data", "model", None, None)
  assert specs.valid.spec == P("data", None)
  placed = jax.device_put(cache, specs)
  assert placed.k.sharding.spec == specs.k.spec
