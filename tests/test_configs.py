"""Every shipped config loads, and builds its experiment with a tiny model swapped in."""

import dataclasses
import glob
import importlib
import os

import pytest

from apex_jax import experiment as apex_experiment
from apex_jax.agents import AgentConfig
from apex_jax.memory import MemoryConfig
from apex_jax.toy.corpus import CorpusConfig
from configs.morse import common
from morse_jax import config_sections
from morse_jax.baselines.run import BaselineConfig
from morse_jax.experiments import experiment
from morse_jax.lora.experts import LoraConfig
from morse_jax.toy.sft import ToyConfig
from tests import test_config_built, tiny_models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "tasks", "fixtures")
DATA = {"humaneval": "", "scicode": os.path.join(FIXTURES, "scicode_mini.json"),
        "srdd": os.path.join(FIXTURES, "srdd_mini.csv"), "synthetic": ""}
CONFIG_FILES = sorted(os.path.basename(p)[:-3] for p in glob.glob(
    os.path.join(ROOT, "configs", "morse", "*.py")) if not p.endswith(("__init__.py",
                                                                      "common.py")))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
  return tiny_models.save_hf_model("qwen3", str(tmp_path_factory.mktemp("cfg")))[0]


def test_there_are_configs():
  assert {"scicode", "srdd", "humaneval", "humaneval_canonical", "scicode_canonical",
          "demo_cpu"} <= set(CONFIG_FILES)


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_builds_with_a_tiny_model(name, tiny_folder, eight_devices):
  module = importlib.import_module(f"configs.morse.{name}")
  own_args = {"smollm2_train_cpu": [None, "fixed_grpo"]}  # the argument is the variant only
  args = own_args[name] if name in own_args else [None] if name in (
      "humaneval_canonical", "scicode_canonical", "demo_cpu", "smollm2_cpu", "table2_cpu",
      "table2_baselines") else [
      f"{v},{b},{h}" for v in common.VARIANTS for b in common.BACKBONES for h in common.HARDWARE]
  built = set()
  for arg in args:
    config = module.get_config(arg)
    assert config.task.family in experiment.FAMILIES
    config.model.path, config.model.dtype = tiny_folder, "float32"
    config.task.path = DATA[config.task.family]
    config.lora.last_n_layers = 1
    config.task.num_problems = 8  # synthetic: a few generated tasks are enough here
    key = (config.system, config.mixture, config.mesh.data, config.mesh.model)
    if key in built or config.task.oracle:
      continue  # the backbone only changes the path the user gives
    built.add(key)
    exp = experiment.build(config)
    assert exp.problems and (exp.agents.lora is None) == (config.mixture == "none")
    assert (exp.mesh is None) == (config.mesh.data * config.mesh.model == 1)
    if config.train.steps:
      trainer = exp.trainer()
      assert trainer.step_config.estimator == config.algo


def test_smollm2_train_config_compares_like_with_like():
  from configs.morse import smollm2_train_cpu  # pylint: disable=import-outside-toplevel

  hgrpo, fixed = smollm2_train_cpu.get_config(None), smollm2_train_cpu.get_config("fixed_grpo")
  assert (hgrpo.mixture, hgrpo.algo, fixed.mixture, fixed.algo) == ("mole", "hgrpo", "fixed",
                                                                    "grpo")
  assert hgrpo.train.max_minutes == 0 and hgrpo.train.steps == fixed.train.steps > 0
  assert hgrpo.task.to_dict() == fixed.task.to_dict() and hgrpo.task.steps == 1
  assert hgrpo.workdir != fixed.workdir and hgrpo.demo
  with pytest.raises(ValueError, match="variant 'single' does not train"):
    smollm2_train_cpu.get_config("single")


def test_bad_settings_are_named(tiny_folder):
  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "srdd")
  config.model.path = tiny_folder
  with pytest.raises(experiment.ConfigError, match="config.task.path is empty"):
    experiment.build(config)
  config.task.path = DATA["srdd"]
  config.mixture = "moe"
  with pytest.raises(experiment.ConfigError, match=r"config.mixture='moe' is not one of"):
    experiment.build(config)
  config.mixture, config.task.split = "mole", "random"
  with pytest.raises(experiment.ConfigError, match=r"config.task.split='random' is not one of"):
    experiment.build(config)
  with pytest.raises(ValueError, match="config variant 'best'"):
    common.apply(common.base(), "best,qwen3_4b,cpu", "srdd")


def test_missing_model_folder_is_named_with_how_to_make_it(tmp_path):
  config = common.apply(common.base(), "single,smollm2_135m,cpu", "humaneval")
  config.model.path = str(tmp_path / "models" / "SmolLM2-135M-Instruct")
  with pytest.raises(experiment.ConfigError, match=r"SmolLM2-135M-Instruct does not exist; it is "
                     r"the smollm2_135m preset's folder: run `make real-model`"):
    experiment.build(config)
  config.model.path = str(tmp_path / "Qwen3-4B")
  with pytest.raises(experiment.ConfigError, match=r"Qwen3-4B does not exist; give a Hugging Face "
                     r"folder or a .gguf file"):
    experiment.build(config)
  assert common.SMOLLM2_PATH.endswith("/SmolLM2-135M-Instruct")  # the name build() recognises
  config = common.apply(common.base(), "single,qwen25_coder_15b,cpu", "humaneval")
  assert (config.model.name, config.model.dtype) == ("Qwen2.5-Coder-1.5B-Instruct", "bfloat16")
  assert config.model.path == common.QWEN25_CODER_15B_PATH
  config.model.path = str(tmp_path / "models" / "Qwen2.5-Coder-1.5B-Instruct")
  with pytest.raises(experiment.ConfigError, match=r"Qwen2.5-Coder-1.5B-Instruct does not exist; "
                     r"it is the qwen25_coder_15b preset's folder: run `make real-model-qwen`"):
    experiment.build(config)


def test_router_switches_reach_the_router_config():
  """config.router's loss and sampling switches: ours by default, the paper's plain loss with
  the regularisers at 0, the draw-consistent log-probability by name."""
  from morse_jax.lora import router as router_lib

  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "srdd")
  assert experiment.router_config(config) == router_lib.RouterConfig(
      dim=config.router.dim, top_k=config.router.top_k)  # the defaults: ours
  config.router.update(proto_l2=0.0, orthogonality=0.0, diversity=0.0,
                       log_prob="distinct_plackett_luce", max_resample=3)
  got = experiment.router_config(config)
  assert (got.proto_l2, got.orthogonality, got.diversity) == (0.0, 0.0, 0.0)
  assert (got.log_prob, got.max_resample) == ("distinct_plackett_luce", 3)
  del config.router["max_resample"]  # a config written before the switch: ours
  assert experiment.router_config(config).max_resample == router_lib.RouterConfig().max_resample


def test_advantage_switches_reach_the_step_config():
  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "srdd")
  step = experiment.train_config(config).step
  assert (step.advantage_clip, step.min_reward_std) == (5.0, 5e-4)  # the reference code's
  config.train.step.update(advantage_clip=0.0, min_reward_std=0.0)  # 0: no clip
  step = experiment.train_config(config).step
  assert (step.advantage_clip, step.min_reward_std) == (0.0, 0.0)


# config section -> the dataclass it becomes, per system
SECTIONS = {
    "morse": {"lora": LoraConfig, "router": experiment.RoutingConfig,
              "train": experiment.TrainConfig, "baseline": BaselineConfig},
    "apex": {"lora": LoraConfig, "agents": AgentConfig, "memory.bank": MemoryConfig,
             "train": apex_experiment.TrainConfig, "ttrl": apex_experiment.TtrlPhase,
             **{f"stages.{m}": apex_experiment.StagePhase
                for m in ("executor", "distiller", "planner")}},
    "toy": {"toy": ToyConfig, "corpus": CorpusConfig},
}


def _shipped(system):
  """(file, argument) of every shipped config of `system`, as the tests load them."""
  if system == "morse":
    for name in CONFIG_FILES:
      variants = [f"{v},{b},{h}" for v in common.VARIANTS for b in common.BACKBONES
                  for h in common.HARDWARE]
      args = {"smollm2_train_cpu": [None, "fixed_grpo"]}.get(name, variants if name in (
          "humaneval", "scicode", "srdd") else [None])
      yield from ((name, arg) for arg in args)
  elif system == "apex":
    yield from sorted(test_config_built.APEX, key=str)
  else:
    yield from [("qwen3", None), ("qwen3_dose", None), *(("apex", str(r)) for r in range(1, 13))]


def _unknown_keys(section, cls, where):
  """The keys of `section` (at config.<where>) that are no field of `cls`, nested ones too."""
  kinds, out = config_sections._field_types(cls), []  # pylint: disable=protected-access
  for key in section:
    if key not in kinds:
      out.append(f"config.{where}.{key}")
    elif dataclasses.is_dataclass(kinds[key][0]) and hasattr(section[key], "keys"):
      out += _unknown_keys(section[key], kinds[key][0], f"{where}.{key}")
  return out


@pytest.mark.parametrize("system", ["morse", "apex", "toy"])
def test_every_key_of_every_shipped_config_is_a_dataclass_field(system):
  """The config tree is the dataclass tree: no section holds a key that its dataclass (or a
  nested one) does not declare."""
  sections, checked = SECTIONS[system], 0
  for name, arg in _shipped(system):
    config = importlib.import_module(f"configs.{system}.{name}").get_config(arg)
    for where, cls in sections.items():
      section = config
      for part in where.split("."):
        section = section[part]
      assert _unknown_keys(section, cls, where) == [], (name, arg)
      checked += 1
  assert checked >= 3 * len(sections)
