"""The jitted HGRPO step on a tiny model: consistency with the sampler, learning signs, skips,
micro-batches and meshes."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora import router
from morse_jax.rl import compaction
from morse_jax.rl import rollout as rl_rollout
from morse_jax.rl import train_step as ts
from morse_jax.rl import update as update_lib
from tests import tiny_models

CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8)
LORA = lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=4)
RCFG = router.RouterConfig(dim=8, top_k=2)
STEP = ts.StepConfig(expert_lr=3e-2, router_lr=3e-2)
# Default rates; the aggregation with per-row weights and the KL term, the most that can differ.
BASE = ts.StepConfig(aggregation="seq-mean-token-mean", kl_coef=0.1)
EMB_DIM = 6
# Node 0: route 0 splits its candidates (within-route signal), route 1 is flat.
# Node 1: route 0 always wins, route 1 always loses (cross-route signal only).
REWARDS = [1.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 0.0]


def requests():
  emb = np.asarray(jax.random.normal(jax.random.key(4), (2, EMB_DIM)))
  prompts = [tiny_models.random_tokens(i, (3 + 2 * i,)).tolist() for i in range(2)]
  return [rl_rollout.NodeRequest(prompts[0], "execute", [[0, 2], [1, 3]], embedding=emb[0]),
          rl_rollout.NodeRequest(prompts[1], "execute", [[0, 1], [2, 3]], embedding=emb[1])]


@pytest.fixture(scope="module")
def setup():
  backbone = llm.init_random(CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  experts = lora.init_experts(LORA, CONFIG, jax.random.key(1))
  # Non-zero B, so that the adapted model differs from the backbone.
  experts = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape),
                         experts)
  out = rl_rollout.rollout(llm.Model(CONFIG, backbone), experts, LORA, requests(),
                           llm.GenerationSettings(6, llm.SamplingConfig(temperature=1.0)),
                           group_size=2, rng=jax.random.key(2), kl=True, kernel="gather")
  return backbone, experts, out


def update_of(step=STEP, donate=()):
  """The tests' update object. Nothing donated by default: the tests reuse their inputs."""
  return update_lib.Update(CONFIG, LORA, step, RCFG, routes_per_node=2, donate=donate)


def run_steps(backbone, experts, batch, rbatch, n, step=STEP, rparams=None):
  rparams = rparams or router.init_router(RCFG, EMB_DIM, 4, jax.random.key(3))
  update = update_of(step)
  states = update.init_opt_states(experts, rparams)
  history = []
  for _ in range(n):
    experts, rparams, states, metrics = update.step_fn(
        backbone, experts, rparams, states, batch, rbatch, update=update, num_routes=4)
    history.append(jax.device_get(metrics))
  return experts, rparams, states, history


def adapter_of(experts, out):
  return update_of().adapter(experts, out.routes)


def test_rollout_layout_and_logprobs(setup):
  backbone, experts, out = setup
  assert out.num_rows == 8 and out.expert_sets[0] == [0, 2, 4] and out.expert_sets[2] == [0, 3, 5]
  np.testing.assert_array_equal(out.route[:8], [0, 0, 1, 1, 2, 2, 3, 3])
  p = out.packed
  # Each row is prompt | completion, and only the completion is trained on.
  for r in range(8):
    prompt = out.requests[out.node_of_row(r)].prompt
    np.testing.assert_array_equal(p.tokens[r, :len(prompt)], prompt)
    np.testing.assert_array_equal(p.tokens[r, len(prompt):len(prompt) + len(out.completions[r])],
                                  out.completions[r])
    assert p.loss_mask[r].sum() == len(out.completions[r]) and p.loss_mask[r, :len(prompt)].sum() == 0
  # The sampler's log-probs (left-padded, incremental decode) equal the update's (packed, one pass).
  logp = rl_rollout.sequence_logprobs(backbone, CONFIG, adapter_of(experts, out), p.tokens,
                              p.attention_mask, 1.0)
  np.testing.assert_allclose(np.asarray(logp) * p.loss_mask, p.logp_old, atol=1e-5)
  ref = rl_rollout.sequence_logprobs(backbone, CONFIG, None, p.tokens, p.attention_mask, 1.0)
  np.testing.assert_allclose(np.asarray(ref) * p.loss_mask, out.logp_ref, atol=1e-6)
  assert np.abs(out.logp_ref - p.logp_old).max() > 1e-3  # the adapters do change the model


@pytest.mark.slow
def test_rollout_pads_to_the_longest_row_and_padding_changes_nothing(setup):
  """T is the longest real row's length bucket, not prompt bucket + max_new_tokens; a step on
  the same rows padded further gives the same loss and experts."""
  backbone, experts, out = setup
  longest = max(len(out.requests[out.node_of_row(r)].prompt) + len(out.completions[r])
                for r in range(out.num_rows))
  assert out.packed.tokens.shape[1] == llm.length_bucket(longest) == 16  # was 16 + 16
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  wide = lambda x: jnp.pad(x, ((0, 0), (0, 40)))
  padded = dataclasses.replace(batch, **{k: wide(getattr(batch, k)) for k in (
      "tokens", "attention_mask", "loss_mask", "logp_old", "logp_ref")})
  ref, got = (run_steps(backbone, experts, b, rb, 1, BASE) for b in (batch, padded))
  np.testing.assert_allclose(got[3][0]["expert_loss"], ref[3][0]["expert_loss"], atol=1e-7)
  chex.assert_trees_all_close(got[0], ref[0], rtol=1e-7, atol=1e-6)


@pytest.mark.parametrize("aggregation", ["token-mean", pytest.param(
    "seq-mean-token-mean", marks=pytest.mark.slow)])  # 4 more compiles: kept out of `make test`
@pytest.mark.slow
def test_leaving_out_a_flat_node_changes_nothing(setup, aggregation):
  """Node 1's rewards are flat: its rows are left out, and two PPO epochs on the other node's rows
  move the experts, the router and the optimiser states exactly as on the whole batch."""
  backbone, experts, out = setup
  rewards = REWARDS[:4] + [0.5] * 4
  step = dataclasses.replace(STEP, aggregation=aggregation)
  batch = dataclasses.replace(rl_rollout.policy_batch(out, rewards), logp_ref=None)
  small, dropped = compaction.without_flat_nodes(batch, routes_per_node=2,
                                                 aggregation=aggregation)
  assert dropped == 1 and small.tokens.shape[0] == 4 and small.valid.sum() == 4
  np.testing.assert_array_equal(small.route, [0, 0, 1, 1])
  assert float(small.token_count) == float(np.sum(batch.loss_mask))
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  ref, got = (run_steps(backbone, experts, b, rb, 2, step) for b in (batch, small))
  chex.assert_trees_all_close(got[:3], ref[:3], rtol=1e-4, atol=1e-5)  # Adam: float noise
  # Adam hides a gradient's scale, so the loss and gradient norm check the denominators.
  for epoch in (0, 1):
    for key in ("expert_loss", "expert_grad_norm", "clip_frac", "router_loss", "skipped"):
      np.testing.assert_allclose(got[3][epoch][key], ref[3][epoch][key], rtol=1e-5, atol=1e-7)
  assert ref[3][0]["skipped_nodes"] == 1 and got[3][0]["skipped_nodes"] == 0  # trainer adds it
  same, none = compaction.without_flat_nodes(
      dataclasses.replace(rl_rollout.policy_batch(out, REWARDS), logp_ref=None),
      routes_per_node=2, aggregation=aggregation)
  assert none == 0 and same.denominator is None
  with pytest.raises(ValueError, match="logp_ref"):
    compaction.without_flat_nodes(rl_rollout.policy_batch(out, rewards), routes_per_node=2,
                                  aggregation=aggregation)


def test_pack_masks_tool_output():
  packed = rl_rollout.pack([[rl_rollout.Segment([5, 6]), rl_rollout.Segment([7], [-0.5]),
                             rl_rollout.Segment([8, 9]), rl_rollout.Segment([10], [-1.0])]],
                           length=8)
  np.testing.assert_array_equal(packed.tokens[0], [5, 6, 7, 8, 9, 10, 0, 0])
  np.testing.assert_array_equal(packed.loss_mask[0], [0, 0, 1, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(packed.attention_mask[0], [1, 1, 1, 1, 1, 1, 0, 0])
  np.testing.assert_allclose(packed.logp_old[0], [0, 0, -0.5, 0, 0, -1.0, 0, 0])
  with pytest.raises(ValueError, match="2 tokens with 1 log-probs"):
    rl_rollout.pack([[rl_rollout.Segment([1, 2], [0.0])]])


def test_bad_rewards_are_named(setup):
  out = setup[2]
  with pytest.raises(ValueError, match=r"shape \(3,\), expected \(8,\)"):
    rl_rollout.policy_batch(out, [1.0, 0.0, 1.0])
  with pytest.raises(ValueError, match="non-finite reward at row 2"):
    rl_rollout.policy_batch(out, [1.0, 0.0, float("nan")] + [0.0] * 5)


@pytest.mark.slow
def test_hgrpo_steps_move_experts_and_router_the_right_way(setup):
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  new_experts, rparams, _, history = run_steps(backbone, experts, batch, rb, 5)
  p = out.packed
  before = rl_rollout.sequence_logprobs(backbone, CONFIG, adapter_of(experts, out), p.tokens,
                                p.attention_mask, 1.0)
  after = rl_rollout.sequence_logprobs(backbone, CONFIG, adapter_of(new_experts, out), p.tokens,
                               p.attention_mask, 1.0)
  gain = np.asarray(((after - before) * p.loss_mask).sum(1))
  assert gain[0] > 0 and gain[1] < 0  # A_within = +1 row more likely, A_within = -1 row less
  logp0 = router.log_probs(router.init_router(RCFG, EMB_DIM, 4, jax.random.key(3)),
                           rb.embeddings, RCFG)
  logp1 = router.log_probs(rparams, rb.embeddings, RCFG)
  pl = lambda lp: np.asarray(router.route_log_prob(lp, rb.subtask_routes))
  assert pl(logp1)[2] > pl(logp0)[2] and pl(logp1)[3] < pl(logp0)[3]  # node 1's routes
  assert history[-1]["expert_loss"] < history[0]["expert_loss"]
  assert history[0]["skipped"] == 0 and history[0]["skipped_nodes"] == 0
  assert all(np.isfinite(v) for m in history for v in jax.tree.leaves(m))


def test_flat_rewards_skip_the_update(setup):
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, [0.3] * 8)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  rparams = router.init_router(RCFG, EMB_DIM, 4, jax.random.key(3))
  got_experts, got_router, states, history = run_steps(backbone, experts, batch, rb, 1,
                                                       rparams=rparams)
  assert history[0]["skipped"] == 1 and history[0]["skipped_nodes"] == 2
  init = ts.init_opt_states(experts, rparams, STEP)
  chex.assert_trees_all_equal((got_experts, got_router, states), (experts, rparams, init))


def test_micro_batches_equal_one_pass(setup):
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  ref = run_steps(backbone, experts, batch, rb, 2, BASE)
  got = run_steps(backbone, experts, batch, rb, 2, dataclasses.replace(BASE, micro_batches=2))
  for key in ("expert_loss", "expert_grad_norm", "clip_frac", "kl", "entropy"):
    np.testing.assert_allclose(got[3][-1][key], ref[3][-1][key], rtol=1e-5, atol=1e-7)
  # The micro-batches sum the gradient in another order and Adam divides by its root mean
  # square, so a weight after two steps may move by a few 1e-5 of itself (one of 768 by 3.7e-5
  # on an AVX-512 machine); a micro-batch left out moves them by far more.
  chex.assert_trees_all_close(got[:2], ref[:2], rtol=1e-4, atol=1e-6)


def test_later_epochs_move_the_experts_and_not_the_router(setup):
  """PPO epochs: the second call on the same rollout with update_router=False moves the experts
  exactly as a second full step would, and leaves the router and its optimiser state alone."""
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  once = run_steps(backbone, experts, batch, rb, 1)
  twice = run_steps(backbone, experts, batch, rb, 2)
  got_experts, got_router, got_states, metrics = update_of().step_fn(
      backbone, once[0], once[1], once[2], batch, rb, jnp.asarray(False), update=update_of(),
      num_routes=4)
  chex.assert_trees_all_close(got_experts, twice[0], rtol=1e-7, atol=1e-6)
  chex.assert_trees_all_equal((got_router, got_states[1]), (once[1], once[2][1]))
  assert float(metrics["clip_frac"]) == pytest.approx(float(twice[3][1]["clip_frac"]), abs=1e-6)
  with pytest.raises(ValueError, match="StepConfig.epochs must be an int >= 1, got 0"):
    ts.StepConfig(epochs=0)


@pytest.mark.parametrize("data,model", [(8, 1), pytest.param(2, 4, marks=pytest.mark.slow),
                                        pytest.param(4, 2, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_sharded_step_equals_one_device(setup, data, model, eight_devices):
  """Rows over 'data' (route means reduced across devices), backbone over 'model'.

  At the default learning rates: Adam divides by sqrt(v), so with a large rate the float noise
  of near-zero gradients becomes visible in the updated weights."""
  from morse_jax.llm import sharding

  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  step = BASE
  ref = run_steps(backbone, experts, batch, rb, 2, step)
  mesh = sharding.make_mesh(data, model)
  place = sharding.shard_rows(mesh)
  sharded_batch = jax.tree.map(lambda x: place(x)[0], batch)
  got = run_steps(sharding.shard_params(backbone, mesh), experts, sharded_batch, rb, 2, step)
  for key in ("expert_loss", "router_loss", "expert_grad_norm", "kl"):
    np.testing.assert_allclose(got[3][-1][key], ref[3][-1][key], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got[:2], ref[:2], rtol=1e-7, atol=1e-5)


@pytest.mark.slow
def test_sharded_experts_and_router_update_equals_one_device(setup, eight_devices):
  """Experts and router laid out by their declared axes on a 2 x 4 mesh (q's and v's B split
  over 'model' like wq / wv, o's A like wo; with these rules the experts axis over 'data' and
  the router's width over 'model' too) update as on one device, and stay laid out so."""
  from jax.sharding import PartitionSpec as P

  from morse_jax.llm import sharding

  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  rparams = router.init_router(RCFG, EMB_DIM, 4, jax.random.key(3))
  ref = run_steps(backbone, experts, batch, rb, 2, BASE, rparams=rparams)
  mesh = sharding.make_mesh(2, 4)
  rules = sharding.ShardingRules(experts="data", router="model")
  placed = lora.shard_experts(experts, mesh, rules)
  placed_router = lora.shard_router(rparams, mesh, rules)
  assert placed["q"].b.sharding.spec == P(None, "data", None, "model")
  assert placed["o"].a.sharding.spec == P(None, "data", "model", None)
  assert placed_router.prototypes.sharding.spec == P("data", "model")
  place = sharding.shard_rows(mesh)
  got = run_steps(sharding.shard_params(backbone, mesh), placed,
                  jax.tree.map(lambda x: place(x)[0], batch), rb, 2, BASE,
                  rparams=placed_router)
  for key in ("expert_loss", "router_loss", "expert_grad_norm"):
    np.testing.assert_allclose(got[3][-1][key], ref[3][-1][key], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got[:2], ref[:2], rtol=1e-7, atol=1e-5)
  assert got[0]["q"].b.sharding.spec == placed["q"].b.sharding.spec


@pytest.mark.slow
def test_the_update_object_donates_the_state_and_evaluates_the_flat_rule_once(setup,
                                                                              monkeypatch):
  """`Update(...)` gives up the experts, router and optimiser state it is called with (the
  returned ones replace them); the flat-node rule runs once on the host and its result is what
  compaction and the step use: a wrong `flat` saying every node is flat skips the update."""
  from morse_jax.rl import advantages

  backbone, experts, out = setup
  rewards = REWARDS[:4] + [0.5] * 4  # node 1 flat
  batch = dataclasses.replace(rl_rollout.policy_batch(out, rewards), logp_ref=None)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  rparams = router.init_router(RCFG, EMB_DIM, 4, jax.random.key(3))
  update = update_of(donate=ts.DONATED)
  calls = []
  monkeypatch.setattr(update_lib, "flat_nodes",
                      lambda *a, **k: calls.append(1) or advantages.flat_nodes(*a, **k))
  monkeypatch.setattr(compaction, "flat_nodes", lambda *a, **k: pytest.fail("evaluated twice"))
  mine = jax.tree.map(jnp.copy, (experts, rparams, update.init_opt_states(experts, rparams)))
  got = update(backbone, *mine, batch, rb, num_routes=4)
  assert calls == [1] and got[4].compacted.dropped_nodes == 1 and got[3]["skipped"] == 0
  assert all(x.is_deleted() for x in jax.tree.leaves(mine))
  assert not any(x.is_deleted() for x in jax.tree.leaves(got[:3]))
  # The same update on the whole batch, nothing donated, with the rule's result passed in.
  ref = run_steps(backbone, experts, batch, rb, 1, rparams=rparams)
  chex.assert_trees_all_close(got[:2], ref[:2], rtol=1e-4, atol=1e-5)
  flat = np.ones(2, bool)
  skipped = update_of()(backbone, experts, rparams, update.init_opt_states(experts, rparams),
                        batch, rb, num_routes=4, flat=flat)
  assert skipped[3]["skipped"] == 1 and calls == [1]
  chex.assert_trees_all_equal(skipped[0], experts)
