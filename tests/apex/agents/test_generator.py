"""The real AdapterGenerator on a tiny random backbone: three role experts, garbage output that
must end as counted format errors or truncations, never a crash."""

import dataclasses

import jax
import numpy as np
import pytest

from apex_jax.agents import (APEX_ROLES, AdapterGenerator, AgentConfig, Executor,
                             SeparateGenerator, Trajectory)
from morse_jax import llm
from morse_jax.lora import experts as lora_lib
from morse_jax.rl.rollout import Segment, pack
from tests.apex.agents import fakes

LORA = lora_lib.LoraConfig(roles=APEX_ROLES, num_subtask_experts=0, last_n_layers=2, rank=2)


@pytest.fixture(scope="module")
def model():
  config = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)
  params = llm.init_random(config, jax.random.PRNGKey(0), scale=0.3)
  return llm.Model(config, params, fakes.tokenizer(), stop_ids=(fakes.EOS,))


@pytest.mark.slow  # ~20 s of CPU: one compile of the sampler with adapters
def test_adapter_generator_runs_the_executor_on_garbage(model):
  experts = lora_lib.init_experts(LORA, model.config, jax.random.PRNGKey(1))
  # distinct role experts (B = 0 at init would make them all the identity)
  experts = {t: dataclasses.replace(w, b=jax.random.normal(jax.random.PRNGKey(2), w.b.shape))
             for t, w in experts.items()}
  gen = AdapterGenerator(model, experts, LORA)
  cfg = AgentConfig(executor_max_new_tokens=8, temperature=1.0)
  trajs = Executor(gen, fakes.FakeSearcher(), cfg).run(["w40 w41", "w42"], ["w30", None],
                                                         rng=jax.random.PRNGKey(3))
  for t in trajs:
    assert t.stats["turns"] == 1 and t.answer is None
    assert t.stats["format_errors"] + t.stats["truncated"] == 1
    turn = t.segments[1]
    assert len(turn.tokens) == len(turn.logprobs) > 0
    assert np.all(np.isfinite(turn.logprobs)) and np.all(np.asarray(turn.logprobs) <= 0)
  packed = pack([t.segments for t in trajs], pad_id=0)
  assert packed.loss_mask.sum() == sum(t.generated_tokens() for t in trajs)
  # each module runs its own role expert: same prompts, same key, different log-probs (the
  # shapes and sampling of the executor's call, so the compiled sampler is reused)
  prompts = [t.segments[0].tokens for t in trajs]
  kw = dict(rng=jax.random.PRNGKey(4), max_new_tokens=8, sampling=cfg.sampling)
  planner, executor = gen.generate("planner", prompts, **kw), gen.generate("executor", prompts,
                                                                          **kw)
  assert not np.allclose(planner[0].logprobs[:1], executor[0].logprobs[:1])


def test_generator_validation(model):
  with pytest.raises(ValueError, match="lacks the module role"):
    AdapterGenerator(model, {}, lora_lib.LoraConfig(roles=("planner",), num_subtask_experts=0))
  with pytest.raises(ValueError, match="both be given or both be None"):
    SeparateGenerator({"executor": (model, {}, None)})
  with pytest.raises(ValueError, match="no model for module 'planner'"):
    SeparateGenerator({"executor": (model, None, None)}).tokenizer_of("planner")
  with pytest.raises(ValueError, match="module 'critic'"):
    AdapterGenerator(model, {}, LORA).tokenizer_of("critic")
  with pytest.raises(ValueError, match="Trajectory.module"):
    Trajectory("critic", [Segment([1])], "", None)


def test_with_experts_copies_and_leaves_the_original():
  """Explicit state: the trainers hand a rollout a generator holding their weights; the caller's
  generator keeps its own (fakes share their records with the copy)."""
  from apex_jax.agents.generator import with_experts
  gen = fakes.ScriptedGenerator(lambda *a: "x")
  gen.experts = None
  held = with_experts(gen, {"w": 1})
  assert held is not gen and held.experts == {"w": 1} and gen.experts is None
  assert held.calls is gen.calls
  plain = fakes.ScriptedGenerator(lambda *a: "x")  # no experts attribute: returned as it is
  assert with_experts(plain, {"w": 1}) is plain
