"""TTRL's episodes (plan -> executor -> decide -> replan -> executor, then the Distiller's
summaries) on the generation engine equal the static sampler's, sampled at T 1 on a tiny random
backbone with three role experts."""

import jax
import numpy as np
import pytest

from apex_jax.agents import AdapterGenerator, AgentConfig
from apex_jax.agents.engines import AgentEngines
from apex_jax.training import rollouts, ttrl
from tests.apex.agents import fakes
from tests.apex.agents.test_engine_generator import LORA, model, role_experts  # noqa: F401
from tests.apex.training.test_ttrl import make_bank


@pytest.mark.slow  # ~60 s of CPU: the static sampler compiles per module and prompt bucket
def test_ttrl_episodes_equal_the_static_paths(model, tmp_path):  # noqa: F811
  agents = AgentConfig(temperature=1.0, prompts="compact", max_turns=2, max_llm_calls=4,
                       max_context_tokens=1024, planner_max_new_tokens=12,
                       executor_max_new_tokens=10, distiller_max_new_tokens=12)
  queries = [ttrl.Query("w40 w41", category="time"), ttrl.Query("w42", category="time")]
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=12)
  experts, out = role_experts(1), []
  for engines in (None, AgentEngines(slots=4, max_len=1024)):
    (tmp_path / str(len(out))).mkdir()
    bank = make_bank(tmp_path / str(len(out)))
    contexts = [bank.planner_context(q.question, category="time") for q in queries]
    gen = AdapterGenerator(model, experts, LORA, engines=engines)
    out.append(rollouts.TtrlEpisodes(fakes.FakeSearcher(), bank, agents)(
        queries, contexts, gen, jax.random.PRNGKey(2), cfg))
  for want, got in zip(*out):
    for a, b in zip(want, got, strict=True):
      assert (a.plan, a.answer, a.workflow, a.summary) == (b.plan, b.answer, b.workflow,
                                                           b.summary)
      for sa, sb in zip(a.trajectory.segments, b.trajectory.segments, strict=True):
        np.testing.assert_array_equal(sa.tokens, sb.tokens)
        if sa.logprobs is not None:
          np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=1e-5)
