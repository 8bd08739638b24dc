"""The agents' generators on the generation engine (apex_jax.agents.engines) against the static
sampler, on a tiny random backbone with three role experts: the executor's trajectories (several
turns, greedy and sampled) and planner / distiller calls equal, log-probs within float error."""

import dataclasses

import jax
import numpy as np
import pytest

from apex_jax.agents import (APEX_ROLES, AdapterGenerator, AgentConfig, Executor,
                             SeparateGenerator)
from apex_jax.agents.engines import AgentEngines
from apex_jax.agents.generator import with_experts
from morse_jax import llm
from morse_jax.lora import experts as lora_lib
from tests.apex.agents import fakes

LORA = lora_lib.LoraConfig(roles=APEX_ROLES, num_subtask_experts=0, last_n_layers=2, rank=2)
CONFIG = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)


@pytest.fixture(scope="module")
def model():
  config = CONFIG
  params = llm.init_random(config, jax.random.PRNGKey(0), scale=0.3)
  # many stop ids: replies end after a few tokens or are cut, so runs take 1 to 3 turns
  return llm.Model(config, params, fakes.tokenizer(), stop_ids=tuple(range(1, 96, 7)))


def role_experts(seed):
  experts = lora_lib.init_experts(LORA, CONFIG, jax.random.PRNGKey(seed))
  return {t: dataclasses.replace(w, b=jax.random.normal(jax.random.PRNGKey(seed + 1), w.b.shape))
          for t, w in experts.items()}


def assert_same(want, got):
  assert [g.text for g in want] == [g.text for g in got]
  for a, b in zip(want, got):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert a.finished == b.finished


@pytest.mark.slow  # ~40 s of CPU: the static sampler compiles per prompt bucket
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_executor_trajectories_equal_the_static_paths(model, temperature):
  experts = role_experts(1)
  cfg = AgentConfig(executor_max_new_tokens=10, temperature=temperature, max_turns=3,
                    on_format_error="feedback", prompts="compact", max_context_tokens=1024)
  questions, plans = ["w40 w41", "w42", "w43 w44 w45", "w46"], ["w30", None, None, "w31"]
  out = []
  for engines in (None, AgentEngines(slots=4, max_len=1024)):
    gen = AdapterGenerator(model, experts, LORA, engines=engines)
    out.append(Executor(gen, fakes.FakeSearcher(), cfg).run(questions, plans,
                                                              rng=jax.random.PRNGKey(3)))
  assert len({t.stats["turns"] for t in out[1]}) > 1
  for a, b in zip(*out):
    assert a.text == b.text and a.stats == b.stats
    for sa, sb in zip(a.segments, b.segments, strict=True):
      np.testing.assert_array_equal(sa.tokens, sb.tokens)
      if sa.logprobs is not None:
        np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=1e-5)


@pytest.mark.slow  # ~60 s of CPU: static and engine programs for three shapes
def test_generate_calls_new_experts_and_long_rows(model):
  """A batched call per module, a trainer's new experts (the engine's adapter replaced, its
  programs kept), and a row longer than the engine's rows (the static sampler, its own key)."""
  engines = AgentEngines(slots=2, max_len=48)
  static, on_engine = (AdapterGenerator(model, role_experts(1), LORA, engines=e)
                       for e in (None, engines))
  prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13] * 9, [14] * 44]  # the last: 44 + 8 > 48
  kw = dict(rng=jax.random.PRNGKey(4), max_new_tokens=8,
            sampling=llm.SamplingConfig(temperature=1.0))
  for module in ("planner", "distiller"):
    assert_same(static.generate(module, prompts, **kw), on_engine.generate(module, prompts, **kw))
  assert engines.fallbacks == 2
  new = role_experts(5)
  assert_same(with_experts(static, new).generate("executor", prompts[:3], **kw),
              with_experts(on_engine, new).generate("executor", prompts[:3], **kw))
  assert_same(static.generate("executor", prompts[:3], **kw),
              on_engine.generate("executor", prompts[:3], **kw))
  assert len(engines._engines) == 1  # one engine for the backbone throughout
  bare = [SeparateGenerator({"planner": (model, None, None)}, engines=e)
          for e in (None, AgentEngines(slots=2, max_len=48))]
  assert_same(*(g.generate("planner", prompts[:3], **kw) for g in bare))


def test_a_mesh_of_several_devices_keeps_the_static_path(model):
  class Mesh:
    size = 2
  gen = AdapterGenerator(model, role_experts(1), LORA, mesh=Mesh(), engines=AgentEngines())
  assert not gen.on_engine()
  assert AdapterGenerator(model, role_experts(1), LORA, engines=AgentEngines()).on_engine()
  assert not AdapterGenerator(model, role_experts(1), LORA).on_engine()


def test_agent_engines_refuse_bad_sizes():
  with pytest.raises(ValueError, match="AgentEngines.slots must be an int >= 1, got 0"):
    AgentEngines(slots=0)
  with pytest.raises(ValueError, match="AgentEngines.max_len"):
    AgentEngines(max_len="long")
