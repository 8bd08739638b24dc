"""The baselines' settings and backbone: the variants' config, the refusals naming the field, and
one sampler call per temperature with the answers in the asks' order."""

import types

import jax
import pytest

from configs.morse import common
from morse_jax.baselines import backbones
from morse_jax.baselines import run as baselines
from morse_jax.baselines.flow import Ask
from morse_jax.config_sections import ConfigError
from morse_jax.experiments import experiment
from morse_jax.mas.agents import Reply


def config(variant="macnet", **baseline):
  c = common.apply(common.base(), f"{variant},qwen25_coder_15b,cpu", "humaneval")
  c.baseline.update(baseline)
  return c


@pytest.mark.parametrize("variant", baselines.SYSTEMS)
def test_variants_are_evaluation_only_systems_on_the_bare_backbone(variant):
  c = config(variant)
  assert (c.system, c.mixture, c.train.steps) == (variant, "none", 0)
  experiment.check(c)


@pytest.mark.parametrize("change,message", [
    (dict(baseline=dict(macnet_edges="0->1,1->0")), "edge 1->0 closes the cycle"),
    (dict(baseline=dict(macnet_topology="ring")), "'ring' is not one of"),
    (dict(baseline=dict(aflow_temperature=-1.0)), "aflow_temperature must be >= 0"),
    (dict(mixture="mole"), "config.mixture='none', not 'mole'"),
])
def test_bad_settings_are_refused_naming_them(change, message):
  c = config(**change.get("baseline", {}))
  if "mixture" in change:
    c.mixture = change["mixture"]
  with pytest.raises(ConfigError, match=message):
    experiment.check(c)


def test_static_chat_makes_one_sampler_call_per_temperature_with_the_asks_keys():
  calls = []

  def replies(prompts, expert_sets, experts=None, *, rng, sampling, row_keys):
    calls.append((len(prompts), sampling.temperature, expert_sets,
                  jax.random.key_data(row_keys).tolist()))
    return [Reply(f"reply to {len(p)} tokens at {sampling.temperature}", 3, False)
            for p in prompts]

  agents = types.SimpleNamespace(tokens=lambda m: list(range(len(m[0]["content"].split()))),
                                 replies=replies)
  chat = backbones.static_chat(agents)
  asks = [Ask("a", [{"role": "user", "content": "one two"}], 0.8),
          Ask("b", [{"role": "user", "content": "one"}]),
          Ask("c", [{"role": "user", "content": "one two three"}])]
  keys = [jax.random.key(k) for k in (7, 8, 9)]
  answers = chat(asks, keys)
  data = lambda *ks: [jax.random.key_data(keys[k]).tolist() for k in ks]
  # greedy rows together, no adapter, each row with its own ask's key
  assert calls == [(2, 0.0, None, data(1, 2)), (1, 0.8, None, data(0))]
  assert [a.text for a in answers] == ["reply to 2 tokens at 0.8", "reply to 1 tokens at 0.0",
                                       "reply to 3 tokens at 0.0"]
  assert [a.prompt_tokens for a in answers] == [2, 1, 3]
