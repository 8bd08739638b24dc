"""Training rollouts on the generation engine: the static path's rollout records (tokens,
log-probs, routes, rewards, advantages) and updates, greedy and seeded sampled, on a tiny random
model whose experts change the replies; one engine kept between updates; the fallbacks."""

from __future__ import annotations

import dataclasses

import chex
import jax
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, EngineError, Request
from morse_jax.lora import ExpertWeights, make_adapter
from morse_jax.rl import advantages as adv_lib
from morse_jax.rl import rollout as rollout_lib
from morse_jax.rl import trainer as trainer_lib
from morse_jax.rl.engine_sampler import EngineSampler
from morse_jax.tasks.token_bandit import TokenBandit
from tests.rl import test_train_step as shapes  # same model and step settings: compiles are shared

ROLLOUT = trainer_lib.RolloutConfig(routes_per_node=2, group_size=2, max_new_tokens=12,
                                    kernel="gather")
TASK = TokenBandit(vocab_size=shapes.CONFIG.vocab_size, categories=4,
                   embed_dim=shapes.EMB_DIM, prompt_len=5)
SAMPLED = llm.SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def model():
  backbone = llm.init_random(shapes.CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  # A fifth of the vocabulary stops a row: rows end at different lengths.
  return llm.Model(shapes.CONFIG, backbone, stop_ids=tuple(range(3, 96, 5)))


def trainers(model, **rollout):
  config = dataclasses.replace(ROLLOUT, **rollout)
  return [trainer_lib.Trainer(model, shapes.LORA, shapes.RCFG, shapes.STEP,
                              dataclasses.replace(config, engine=engine),
                              embed_dim=shapes.EMB_DIM) for engine in (False, True)]


def loud(state):
  """Experts that change the replies (init_experts' b = 0 adds nothing)."""
  keys = iter(jax.random.split(jax.random.key(4), 16))
  experts = {t: ExpertWeights(a=e.a * 10, b=0.5 * jax.random.normal(next(keys), e.b.shape))
             for t, e in state.experts.items()}
  return dataclasses.replace(state, experts=experts)


def advantages(rollout, rewards):
  batch = rollout_lib.policy_batch(rollout, rewards)
  out = adv_lib.row_advantages(batch.rewards, batch.route, batch.valid,
                               num_nodes=rollout.num_nodes,
                               routes_per_node=rollout.routes_per_node)
  return np.asarray(out.policy), np.asarray(out.route)


def assert_same_rollout(a, b, ra, rb):
  assert [x.tolist() for x in a.completions] == [x.tolist() for x in b.completions]
  np.testing.assert_array_equal(a.packed.tokens, b.packed.tokens)
  np.testing.assert_array_equal(a.packed.loss_mask, b.packed.loss_mask)
  np.testing.assert_allclose(a.packed.logp_old, b.packed.logp_old, atol=1e-5, rtol=0)
  assert a.expert_sets == b.expert_sets
  np.testing.assert_array_equal(a.route, b.route)
  chex.assert_trees_all_equal(a.routes, b.routes)
  np.testing.assert_array_equal(ra, rb)
  for x, y in zip(advantages(a, ra), advantages(b, rb)):
    np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [llm.GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_an_engine_rollout_equals_the_static_one(model, sampling):
  """Two nodes x 2 routes x 2 candidates with routes that change the replies, a kept engine
  used twice (the second time with other experts: `set_adapter`)."""
  experts = loud(trainers(model)[0].init_state(jax.random.key(7))).experts
  settings = llm.GenerationSettings.for_model(model, 12, sampling)
  sampler, lengths = EngineSampler(model), set()
  for k, weights in enumerate((experts, jax.tree.map(lambda x: -x, experts))):
    call = lambda **kw: rollout_lib.rollout(model, weights, shapes.LORA, shapes.requests(),
                                            settings, group_size=2, rng=jax.random.key(k),
                                            kernel="gather", **kw)
    static, engine = call(), call(sampler=sampler)
    rewards = np.asarray([len(c) % 3 for c in static.completions], np.float32)
    assert_same_rollout(static, engine, rewards, rewards)
    lengths |= {len(c) for c in engine.completions}
  assert len(lengths) > 1  # ragged rows: some ended before others
  assert sampler.builds == 1 and sampler.fallbacks == 0
  # Routes padded to every expert (zero weights): a merge's wider route needs no other engine.
  assert sampler.engine.adapter.routes.idx.shape[1] == shapes.LORA.num_experts


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [llm.GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_engine_rollouts_give_the_static_paths_updates(model, sampling):
  """Two updates, the second on the rows the first one's experts sampled: same records, same
  experts and router after each (the update sees the same batch)."""
  static, engine = trainers(model, sampling=sampling)
  states = [loud(t.init_state(jax.random.key(7))) for t in (static, engine)]
  for cursor in (0, 2):
    nodes, reward_fn = TASK.batch(cursor, 2)
    out = [t.step(s, nodes, reward_fn) for t, s in zip((static, engine), states)]
    (s0, m0, r0), (s1, m1, r1) = out
    assert_same_rollout(r0, r1, reward_fn(r0), reward_fn(r1))
    chex.assert_trees_all_close(s0.experts, s1.experts, atol=1e-5)
    chex.assert_trees_all_close(s0.router, s1.router, atol=1e-5)
    assert m0["expert_loss"] == pytest.approx(m1["expert_loss"], abs=1e-5)
    states = [s0, s1]
  assert engine.sampler.builds == 1 and engine.sampler.fallbacks == 0  # one engine for all
  assert static.sampler is None


@pytest.mark.slow  # three engines' programs
def test_a_wider_or_longer_call_rebuilds_the_engine_larger(model):
  sampler = EngineSampler(model)
  settings = llm.GenerationSettings.for_model(model, 8, SAMPLED)
  for rows, prompt in ((4, 5), (12, 5), (40, 5), (2, 1100)):
    out = sampler(model, [[1] * prompt] * rows, settings, rng=jax.random.key(0))
    assert out.tokens.shape == (rows, 8)
  assert sampler.builds == 3  # 32 x 1024 held 4 and 12 rows
  config = sampler.engines[False].config  # the bare backbone's
  assert (config.slots, config.max_len) == (64, 2048)


def test_a_call_the_engine_fails_goes_to_the_static_sampler(model, monkeypatch):
  sampler = EngineSampler(model)
  settings = llm.GenerationSettings.for_model(model, 8, SAMPLED)

  def fail(*args, **kwargs):
    raise EngineError("decode failed for 2 rows")

  prompts = [[1, 2, 3], [4, 5]]
  want = llm.sample(model, prompts, settings, rng=jax.random.key(2))
  monkeypatch.setattr(Engine, "generate", fail)
  got = sampler(model, prompts, settings, rng=jax.random.key(2))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert sampler.fallbacks == 1 and not sampler.engines  # rebuilt at the next call
  with pytest.raises(ValueError, match="another model"):
    sampler(llm.Model(model.config, model.params), prompts, settings, rng=jax.random.key(2))


@pytest.mark.slow
def test_generate_runs_prompt_repeats_as_groups_with_the_static_keys(model):
  """Rows in runs of r: one prefill per run (shared pages), row i still draws with
  fold_in(rng, i)."""
  settings = llm.GenerationSettings.for_model(model, 10, SAMPLED, prompt_repeats=3)
  prompts = [[1, 2, 3, 4]] * 3 + [[7, 8]] * 3
  engine = Engine(model, EngineConfig(slots=8, max_len=64))
  got = engine.generate(prompts, settings, rng=jax.random.key(5))
  want = llm.sample(model, prompts, settings, rng=jax.random.key(5))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
  assert engine.stats["prefill_tokens"] == 6  # each run's prompt once
  with pytest.raises(ValueError, match="prompt_repeats=3 must be an int >= 1 dividing the 4"):
    engine.generate(prompts[:4], settings, rng=jax.random.key(5))
  with pytest.raises(ValueError, match="row 4 differs from row 3 of its run .prompt."):
    engine.generate(prompts[:4] + [[9]] + prompts[5:], settings, rng=jax.random.key(5))
  assert not engine.busy  # refused before any row was submitted
  with pytest.raises(ValueError, match="keys holds 1 keys for n = 2"):
    engine.submit_group(Request([1, 2], 4), 2, [jax.random.key(0)])


def test_set_adapter_keeps_the_engine_and_refuses_what_it_cannot_take(model):
  static, _ = trainers(model)
  experts = loud(static.init_state(jax.random.key(7))).experts
  sets = [[0, 2, 3], [0, 4, 5]]
  adapter = lambda sets: make_adapter(experts, shapes.LORA, model.config, sets,
                                                  kernel="gather")
  engine = Engine(model, EngineConfig(slots=4, max_len=64), adapter=adapter(sets))
  engine.set_adapter(adapter(sets[::-1]))
  with pytest.raises(ValueError, match="rows of"):
    engine.set_adapter(adapter([[0, 2], [0, 4]]))  # narrower rows: another program
  with pytest.raises(ValueError, match="built with an adapter needs one"):
    engine.set_adapter(None)
  engine.submit(Request([1, 2], 4, route=jax.tree.map(lambda a: a[0],
                                                      adapter(sets).row_data)))
  with pytest.raises(RuntimeError, match="requests are waiting or live"):
    engine.set_adapter(adapter(sets))


def test_the_engine_switch_leaves_a_runs_identity_alone(model):
  static, engine = trainers(model)
  assert static.metadata() == engine.metadata()
  assert "engine" not in static.metadata()["rollout"]


def test_min_prefill_rows_pads_a_pass_to_one_program(model):
  engine = Engine(model, EngineConfig(slots=4, max_len=64, min_prefill_rows=4))
  engine.generate([[1, 2, 3]], llm.GenerationSettings.for_model(model, 2), rng=jax.random.key(0))
  assert engine.stats["prefill_computed"] == 4 * 32  # one row in a 4-row pass of short chunks
  with pytest.raises(ValueError, match="min_prefill_rows must be a power of two, got 3"):
    EngineConfig(min_prefill_rows=3)
