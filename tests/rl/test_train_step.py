"""One jitted HGRPO step on a tiny model: consistency with the sampler, and learning signs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora import mixture, router
from morse_jax.rl import train_step as ts
from tests import tiny_models

CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8)
LORA = lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=4)
RCFG = router.RouterConfig(dim=8, top_k=2)
STEP = ts.StepConfig(expert_lr=3e-2, router_lr=3e-2)
SETS = [[0, 2, 3], [0, 4, 5], [1, 2, 4], [1, 3, 5]]


@pytest.fixture(scope="module")
def rollout():
  backbone = llm.init_random(CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  experts = lora.init_experts(LORA, CONFIG, jax.random.key(1))
  adapter = lora.make_adapter(experts, LORA, CONFIG, SETS, kernel="gather")
  prompts = [tiny_models.random_tokens(i, (3 + i,)).tolist() for i in range(4)]
  out = llm.sample(backbone, CONFIG, prompts, max_new_tokens=6, rng=jax.random.key(2),
                   sampling=llm.SamplingConfig(temperature=1.0), adapter=adapter)
  p = max(map(len, prompts))
  tokens, mask = llm.sampling.left_pad(prompts, p, 4, 0)
  gen_mask = (np.arange(6)[None] < out.lengths[:, None]).astype(np.int32)
  batch = ts.PolicyBatch(
      tokens=jnp.asarray(np.concatenate([tokens, out.tokens], 1)),
      attention_mask=jnp.asarray(np.concatenate([mask, gen_mask], 1)),
      loss_mask=jnp.asarray(np.concatenate([np.zeros_like(mask), gen_mask], 1)),
      logp_old=jnp.asarray(np.concatenate([np.zeros(mask.shape, np.float32), out.logprobs], 1)),
      advantages=jnp.asarray([1.0, -1.0, 0.0, 0.0]), routes=adapter.routes)
  return backbone, experts, adapter, batch


def run_steps(backbone, experts, batch, router_batch, n, step=STEP):
  rparams = router.init_router(RCFG, 6, 4, jax.random.key(3))
  states = ts.init_opt_states(experts, rparams, step)
  history = []
  for _ in range(n):
    experts, rparams, states, metrics = ts.train_step(
        backbone, experts, rparams, states, batch, router_batch, config=CONFIG,
        router_config=RCFG, step_config=step, layers=LORA.adapted_layers(CONFIG),
        scale=LORA.scale, kernel="gather")
    history.append(jax.device_get(metrics))
  return experts, rparams, history


def router_batch():
  emb = jax.random.normal(jax.random.key(4), (2, 6))
  return ts.RouterBatch(embeddings=jnp.tile(emb[:1], (2, 1)),
                        subtask_routes=jnp.asarray([[0, 1], [2, 3]]),
                        advantages=jnp.asarray([1.0, -1.0]))


def test_training_logprobs_equal_sampling_logprobs(rollout):
  backbone, _, adapter, batch = rollout
  logp = ts.token_logprobs(backbone, CONFIG, adapter, batch.tokens, batch.attention_mask)
  np.testing.assert_allclose(np.asarray(logp * batch.loss_mask), np.asarray(batch.logp_old),
                             atol=1e-5)


def test_hgrpo_steps_move_experts_and_router_the_right_way(rollout):
  backbone, experts, adapter, batch = rollout
  rb = router_batch()
  new_experts, rparams, history = run_steps(backbone, experts, batch, rb, 5)
  assert float(jnp.abs(new_experts["q"].b).sum()) > 0  # B left zero: the experts learned
  before = ts.token_logprobs(backbone, CONFIG, adapter, batch.tokens, batch.attention_mask)
  after_adapter = mixture.Adapter(experts=new_experts, routes=adapter.routes,
                                  layers=adapter.layers, scale=adapter.scale, kernel="gather")
  after = ts.token_logprobs(backbone, CONFIG, after_adapter, batch.tokens, batch.attention_mask)
  gain = np.asarray(((after - before) * batch.loss_mask).sum(1))
  assert gain[0] > 0 and gain[1] < 0  # A = +1 row more likely, A = -1 row less likely
  logp0 = router.log_probs(router.init_router(RCFG, 6, 4, jax.random.key(3)), rb.embeddings, RCFG)
  logp1 = router.log_probs(rparams, rb.embeddings, RCFG)
  pl = lambda lp: np.asarray(router.route_log_prob(lp, rb.subtask_routes))
  assert pl(logp1)[0] > pl(logp0)[0] and pl(logp1)[1] < pl(logp0)[1]
  assert history[-1]["expert_loss"] < history[0]["expert_loss"]
  assert all(np.isfinite(v) for m in history for v in jax.tree.leaves(m))


@pytest.mark.parametrize("data,model", [(4, 2), (2, 4)])
def test_sharded_step_equals_one_device(rollout, data, model, eight_devices):
  """Rows over 'data', backbone over 'model': the same losses and updated experts.

  At the default learning rates: Adam divides by sqrt(v), so with a large rate the float noise
  of near-zero gradients becomes visible in the updated weights."""
  from morse_jax.llm import sharding

  backbone, experts, _, batch = rollout
  rb = router_batch()
  step = ts.StepConfig()
  ref_experts, ref_router, ref_history = run_steps(backbone, experts, batch, rb, 2, step)
  mesh = sharding.make_mesh(data, model)
  place = sharding.shard_rows(mesh)
  sharded_batch = ts.PolicyBatch(*place(batch.tokens, batch.attention_mask, batch.loss_mask,
                                        batch.logp_old, batch.advantages),
                                 routes=mixture.Routes(*place(batch.routes.idx, batch.routes.w)))
  got_experts, got_router, got_history = run_steps(sharding.shard_params(backbone, mesh),
                                                   experts, sharded_batch, rb, 2, step)
  for key in ("expert_loss", "router_loss", "expert_grad_norm"):
    np.testing.assert_allclose(got_history[-1][key], ref_history[-1][key], rtol=1e-5, atol=1e-6)
  for got, ref in zip(jax.tree.leaves((got_experts, got_router)),
                      jax.tree.leaves((ref_experts, ref_router))):
    np.testing.assert_allclose(got, ref, atol=1e-5)
