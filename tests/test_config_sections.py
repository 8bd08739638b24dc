"""Every field of every settings dataclass of both systems' configs (MoRSE: the update, the
adapters, the router, the rollout and its sampling; APEx: also the agents, the memory bank, the
three stages and TTRL) can be set from the command line (`--config.train.step.epsilon=0.28`),
and bad values are named."""

import dataclasses

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from apex_jax import experiment as apex_experiment
from configs.apex import demo_cpu as apex_demo
from configs.morse import common
from morse_jax.config_sections import ConfigError, section, settings
from morse_jax.lora.experts import LoraConfig
from morse_jax.experiments import experiment
from morse_jax.llm.sampling import SamplingConfig
from morse_jax.rl.train_step import StepConfig
from apex_jax.agents import AgentConfig
from apex_jax.memory import MemoryConfig
from apex_jax.training.stages import STAGE_ORDER

# Valid values for fields whose type alone does not give one: the first that is not the default.
CHOICES = {"aggregation": ("seq-mean-token-mean",), "log_prob": ("sum_log_p",),
           "merge_experts": ("random_subset",), "targets": (("q", "k"),), "layers": ((-1,),),
           "estimator": ("grpo",), "kernel": ("dense", "grouped"),
           "train_kernel": ("grouped", "dense"), "prompts": ("authors", "compact"),
           "on_format_error": ("feedback", "end"), "store": ("best", "all"),
           "summaries": ("rule", "distiller"), "embedder": ("sentence",)}


def other_value(name, default, kind):
  if name in CHOICES:
    return next(v for v in CHOICES[name] if v != default)
  if isinstance(default, bool):
    return not default
  if isinstance(default, int):
    return default + 1
  if isinstance(default, float) or kind is float:
    return 0.375 if not default else default * 0.5
  if kind is int:  # None by default
    return 7
  raise AssertionError(f"no test value for {name}={default!r}")


def parse(config, *overrides):
  """The config after command-line overrides, parsed as launchers.train parses them."""
  argv = ["prog", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_dict("config", config, flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


def walk(cls, make_config, where, build, elsewhere=(), others=()):
  """Sets each field of `cls` in config.<where> from the command line, one at a time, and
  checks that `build(config)` carries it. `elsewhere`: the fields the section leaves out;
  `others`: the section's keys that are no field; a nested dataclass field is walked on its own.
  Returns the fields walked."""
  defaults = build(make_config())
  section_fields = _at(make_config(), where) - set(others)
  names = [f.name for f in dataclasses.fields(cls)]
  assert sorted(section_fields) == sorted(set(names) - set(elsewhere))
  kinds = {f.name: f.type for f in dataclasses.fields(cls)}
  walked = []
  for name in sorted(section_fields):
    default = getattr(defaults, name)
    if dataclasses.is_dataclass(default) or isinstance(default, dict):
      continue
    kind = int if "int" in str(kinds[name]) else float
    value = other_value(name, default, kind)
    text = str(value) if not isinstance(value, str) else value
    got = build(parse(make_config(), f"--config.{where}.{name}={text}"))
    assert getattr(got, name) == value, (where, name, getattr(got, name), value)
    assert got == dataclasses.replace(defaults, **{name: value}), (where, name)
    walked.append(name)
  return walked


def _at(config, dotted):
  for part in dotted.split("."):
    config = config[part]
  return set(config.keys())


def morse_config():
  return common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "synthetic")


def morse_rollout(c):
  return experiment.rollout_config(experiment.train_config(c), routed=True)


def morse_step(c):
  return experiment.train_config(c).step


def test_every_morse_setting_is_reachable_from_the_command_line():
  walk(StepConfig, morse_config, "train.step", morse_step,
       elsewhere=("estimator", "temperature"))  # config.algo; the rollout's temperature
  walk(LoraConfig, morse_config, "lora", experiment.lora_config, elsewhere=("roles",))
  walk(experiment.RoutingConfig, morse_config, "router", experiment.routing_config)
  walked = walk(experiment.TrainConfig, morse_config, "train", experiment.train_config)
  assert "kernel" in walked and "train_kernel" in walked
  assert walk(SamplingConfig, morse_config, "train.sampling",
              lambda c: morse_rollout(c).sampling) == ["temperature", "top_k", "top_p"]


def test_without_a_router_the_one_route_gets_every_sample():
  c = morse_config()
  c.train.update(routes_per_node=3, group_size=2)
  fixed = experiment.rollout_config(experiment.train_config(c), routed=False)
  assert (fixed.routes_per_node, fixed.group_size) == (1, 6)
  assert fixed == dataclasses.replace(morse_rollout(c), routes_per_node=1, group_size=6)


def apex_stage(module, n=10):
  return lambda c: settings(apex_experiment.StagePhase, c.stages[module], f"stages.{module}",
                            module=module).stage(n)


def apex_phase(module):
  return lambda c: settings(apex_experiment.StagePhase, c.stages[module], f"stages.{module}",
                            module=module)


def apex_ttrl(c):
  return settings(apex_experiment.TtrlPhase, c.ttrl, "ttrl")


def apex_step(c):
  return apex_experiment.train_config(c).step


def test_every_apex_setting_is_reachable_from_the_command_line():
  walk(StepConfig, apex_demo.get_config, "train.step", apex_step,
       elsewhere=apex_experiment.STEP_SET_ELSEWHERE)
  walk(apex_experiment.TrainConfig, apex_demo.get_config, "train", apex_experiment.train_config)
  walk(LoraConfig, apex_demo.get_config, "lora", apex_experiment.lora_config,
       elsewhere=("roles", "num_subtask_experts"))
  assert "max_queries" in walk(AgentConfig, apex_demo.get_config, "agents",
                               lambda c: settings(AgentConfig, c.agents, "agents"))
  assert "dedup_gate" in walk(MemoryConfig, apex_demo.get_config, "memory.bank",
                              lambda c: settings(MemoryConfig, c.memory.bank, "memory.bank"))
  for module in STAGE_ORDER:
    walk(apex_experiment.StagePhase, apex_demo.get_config, f"stages.{module}",
         apex_phase(module), elsewhere=("module",))
  walk(apex_experiment.TtrlPhase, apex_demo.get_config, "ttrl", apex_ttrl)


def _with(config, where, key, value):
  """config with config.<where>.<key> = value, bypassing ConfigDict's own type check (as a
  config file that builds its sections from plain dicts would)."""
  *parents, last = where.split(".")
  holder = config
  for part in parents:
    holder = holder[part]
  holder[last] = ml_collections.ConfigDict({**holder[last], key: value})
  return config


BUILDS = [  # (config, section, build, a field and a value of the wrong type for it)
    (morse_config, "train.step", morse_step, "epochs", "two"),
    (morse_config, "lora", experiment.lora_config, "rank", 2.5),
    (morse_config, "train.sampling", morse_rollout, "top_k", "all"),
    (apex_demo.get_config, "lora", apex_experiment.lora_config, "alpha", "high"),
    (apex_demo.get_config, "train.step", apex_step, "epochs", 1.5),
    (apex_demo.get_config, "agents", lambda c: settings(AgentConfig, c.agents, "agents"),
     "max_turns", "five"),
    (apex_demo.get_config, "memory.bank",
     lambda c: settings(MemoryConfig, c.memory.bank, "memory.bank"), "k", 2.0),
    (apex_demo.get_config, "stages.planner", apex_stage("planner"), "group_size", "4"),
    (apex_demo.get_config, "ttrl", lambda c: apex_ttrl(c).ttrl(10), "hard_gate", 1),
]


@pytest.mark.parametrize("make_config,where,build,field,wrong", BUILDS)
def test_an_unknown_key_and_a_wrong_type_are_named(make_config, where, build, field, wrong):
  with pytest.raises(ConfigError, match=rf"config\.{where}\.clip_eps=0\.28: \w+ has no such"):
    build(_with(make_config(), where, "clip_eps", 0.28))
  with pytest.raises(ConfigError, match=rf"config\.{where}\.{field}={wrong!r}: expected"):
    build(_with(make_config(), where, field, wrong))


def test_a_stray_training_key_is_named():
  c = morse_config()
  c.train.temperature = 0.7  # the sampling temperature is config.train.sampling.temperature
  with pytest.raises(ConfigError, match=r"config.train.temperature=0.7: TrainConfig has no such"):
    experiment.train_config(c)


def test_a_section_round_trips_and_bad_values_are_named():
  step = StepConfig(epsilon_high=0.28, norm_len=512, advantage_clip=0.0)
  assert settings(StepConfig, section(step), "train.step") == step
  fresh = section(StepConfig())
  assert fresh.epsilon_high is None and fresh.norm_len is None
  fresh.norm_len = 256  # a placeholder of the field's type: a flag can set it
  assert settings(StepConfig, fresh, "train.step").norm_len == 256
  cases = [({"epsilon": "wide"}, r"config.train.step.epsilon='wide': expected a number"),
           ({"epochs": 1.5}, r"config.train.step.epochs=1.5: expected an int"),
           ({"remat": 1}, r"config.train.step.remat=1: expected True or False"),
           ({"clip_eps": 0.28}, r"config.train.step.clip_eps=0.28: StepConfig has no such field"),
           ({"epochs": 0}, r"config.train.step: StepConfig.epochs must be an int >= 1, got 0"),
           ({"weight_decay": -0.1},
            r"config.train.step: StepConfig.weight_decay must be >= 0, got -0.1"),
           ({"expert_lr": None}, r"config.train.step.expert_lr=None: must be set")]
  for values, match in cases:
    with pytest.raises(ConfigError, match=match):
      settings(StepConfig, values, "train.step")
  with pytest.raises(ConfigError, match=r"train.step.estimator='grpo': set from elsewhere"):
    settings(StepConfig, {"estimator": "grpo"}, "train.step", estimator="hgrpo")
  # A section written before a field existed: the field keeps its default.
  assert settings(StepConfig, ml_collections.ConfigDict({"epochs": 2}), "s") == StepConfig(epochs=2)


def logged_toy_configs(log):
  """The ToyConfig dicts `launchers.pretrain_toy` printed in a committed log, in order."""
  import ast
  import os
  import re

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "assets", log)) as f:
    return [ast.literal_eval(m) for m in re.findall(r"params; (\{.*?\}); setup", f.read())]


def test_the_toy_configs_are_the_committed_toys_runs():
  from configs.toy import apex, qwen3, qwen3_dose
  from morse_jax.toy.sft import ToyConfig

  toy = lambda c: dataclasses.asdict(settings(ToyConfig, c.toy, "toy"))
  assert toy(qwen3.get_config()) == logged_toy_configs("toy_qwen3_pretrain.log")[0]
  assert toy(qwen3_dose.get_config()) == logged_toy_configs("toy_qwen3_dose.log")[0]
  logged = logged_toy_configs("toy_apex_pretrain.log")
  assert toy(apex.get_config("1")) == logged[0]
  used = ("buckets", "max_len", "batch", "lr", "warmup", "steps", "seed")  # runs 2-4 continue
  for run in (2, 3, 4, 5):
    got = toy(apex.get_config(str(run)))
    assert {k: got[k] for k in used} == {k: logged[run - 1][k] for k in used}, run
  assert qwen3_dose.get_config().data.categories == ("string_analysis",)
  c = apex.get_config("3")
  assert (c.corpus.judge_share, c.corpus.align_share, c.corpus.distill_batches) == (0.2, 0.15, 3)
  assert c.init == "/tmp/toy_apex_2" and apex.get_config("4").out == "/tmp/toy_apex_4"
  for run, line in ((7, 5), (8, 6), (12, 7)):  # logged after run 5 (6, 9-11 are not in the log)
    got = toy(apex.get_config(str(run)))
    assert {k: got[k] for k in used} == {k: logged[line][k] for k in used}, run
  assert apex.get_config("12").out == "assets/toy_apex"  # the committed run
  # the comparison systems' toy: run 13 from the committed one, as its own log has it
  mia = apex.get_config(str(apex.MIA_FORMS))
  assert (mia.init, mia.out, mia.corpus.mia_share) == ("assets/toy_apex", "assets/toy_apex_mia", 0.5)
  assert toy(mia) == logged_toy_configs("toy_apex_mia_pretrain.log")[0]
  assert apex.get_config("8").out == apex.get_config("12").init == "/tmp/toy_apex_8"
  assert apex.get_config("7").out == apex.get_config("8").init == "/tmp/toy_apex_7"
  assert apex.get_config("5").out == apex.get_config("7").init == "/tmp/toy_apex_5"
  assert apex.get_config("6").init == "/tmp/toy_apex_5"
