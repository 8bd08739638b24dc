"""An APEx experiment's pieces from an ml_collections config (configs/apex/*.py): data, search,
memory bank, generator, updater and agents. The phases that run them (memory building, the
stages, TTRL, the ablation table) are in `apex_jax.pipeline`.

  exp = build(config)                        # data, search, bank, generator, updater, agents
  phase = settings(StagePhase, config.stages.executor, "stages.executor", module="executor")
  agents_for(exp, phase, "stages.executor")  # the agents' settings inside one phase

Every section that becomes a dataclass is `config_sections.section` of it in the config file and
`settings` of it here: `agents` (AgentConfig), `memory.bank` (MemoryConfig), `lora`
(LoraConfig, the roles APEx's), `train` (TrainConfig), `stages.<module>` (StagePhase), `ttrl`
(TtrlPhase).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

from morse_jax import llm
from morse_jax.llm import vl
from morse_jax.config_sections import as_base, section, settings
from morse_jax.lora import experts as lora_lib
from morse_jax.rl import train_step as ts

from apex_jax.agents import APEX_ROLES, AdapterGenerator, AgentConfig, Executor
from apex_jax.datasets import read_examples, sources, World, world_images
from apex_jax.datasets.world_questions import split as split_examples
from apex_jax.memory import MemoryBank, MemoryConfig
from apex_jax.memory.schema import CATEGORIES
from apex_jax.tools import LocalSearch
from apex_jax.tools.image_search import ImageSearch
from apex_jax.tools.images import IMAGE_SIZE
from apex_jax.tools.overlap import NgramSearch, WordSearch
from apex_jax.tools.passages import read_corpus
from apex_jax.agents.vl_generator import VlGenerator
from apex_jax.training.grpo import ModuleUpdater, VlModuleUpdater
from apex_jax.training.stages import StageConfig
from apex_jax.training.ttrl import TtrlConfig
from morse_jax.lora.embedders import BackboneMeanEmbedder, SentenceEmbedder

# The step's fields APEx sets itself: GRPO always, each stage's learning rate and temperature,
# and no router.
STEP_SET_ELSEWHERE = ("estimator", "expert_lr", "temperature", "router_lr", "alpha_pi")
# LoraConfig's (`lora_config`): the three modules are role experts, none a subtask expert.
LORA_SET_ELSEWHERE = ("roles", "num_subtask_experts")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """config.train: the modules' GRPO update (`step`: the loss and advantage forms; each stage
  and TTRL set its learning rate and temperature) and the stages' checkpoints."""
  checkpoint_every: int = 1  # the stages save every n updates (0: at each stage's end)
  # True: go on in a workdir whose checkpoints another config wrote (morse_jax.checkpoint)
  continue_other_run: bool = False
  step: ts.StepConfig = dataclasses.field(default=ts.StepConfig(estimator="grpo"),
                                          metadata={"set_elsewhere": STEP_SET_ELSEWHERE})


@dataclasses.dataclass(frozen=True)
class Phase:
  """What a stage's or TTRL's section holds beside its dataclass's fields (mixed into
  StagePhase and TtrlPhase, whose `steps` and `batch_size` it reads): `epochs`, passes over
  the phase's inputs that give its steps (0: `steps`), and `agents`, AgentConfig fields the
  phase sets over config.agents (configs/apex/paper.py: the paper's tool-output and context
  lengths per module; checked as config.<phase>.agents by `agents_for`)."""
  epochs: int = 0
  agents: dict = dataclasses.field(default_factory=dict)

  @property
  def runs(self) -> bool:
    """False for steps 0 and no epochs: the pipeline leaves the phase out."""
    return bool(self.steps or self.epochs)

  def steps_over(self, n: int) -> int:
    """`steps`, or `epochs` passes over n inputs at `batch_size` per step (rounded up)."""
    if not self.epochs:
      return self.steps
    return max(1, -(-self.epochs * n // max(self.batch_size, 1)))  # batch_size: its check

  def _check(self, base) -> None:
    if isinstance(self.epochs, bool) or self.epochs < 0:
      raise ValueError(f"{type(self).__name__}.epochs must be an int >= 0, got {self.epochs!r}")
    if self.runs:  # the dataclass's own checks, with the steps its epochs give
      as_base(self, base, steps=self.steps_over(1))


@dataclasses.dataclass(frozen=True)
class StagePhase(Phase, StageConfig):
  """config.stages.<module>: a StageConfig (its module the key) that may give its steps as
  epochs, and the agents' settings of its rollouts."""

  def __post_init__(self):
    self._check(StageConfig)

  def stage(self, n: int) -> StageConfig:
    """The StageConfig the stage runs over n inputs."""
    return as_base(self, StageConfig, steps=self.steps_over(n))


@dataclasses.dataclass(frozen=True)
class TtrlPhase(Phase, TtrlConfig):
  """config.ttrl: a TtrlConfig that may give its steps as epochs, the agents' settings of its
  episodes, whether stored workflows are the Distiller's summaries (else the executor's
  traces), and its checkpoint cadence (steps; each with the memory bank's snapshot)."""
  summarize: bool = True
  checkpoint_every: int = 1

  def __post_init__(self):
    self._check(TtrlConfig)

  def ttrl(self, n: int) -> TtrlConfig:
    """The TtrlConfig TTRL runs over n queries."""
    return as_base(self, TtrlConfig, steps=self.steps_over(n))


SOURCES, SEARCHES, EMBEDDERS, JUDGES = ("world", "folder", "hotpotqa", "twowiki") + \
    sources.IMAGE_SETS, \
    ("word", "ngram", "index"), \
    ("backbone_mean", "sentence"), ("inprocess", "http")


def choice(value, name: str, allowed) -> str:
  """value, if allowed; else a ValueError naming config.<name>, the value and what is allowed."""
  if value not in allowed:
    raise ValueError(f"config.{name} {value!r} not in {allowed}")
  return value


@dataclasses.dataclass
class Experiment:
  config: Any
  model: llm.Model
  train: list  # QAExamples with gold answers: stages and memory building
  test: list  # held out: TTRL (answers unused) and evaluation
  searcher: Any
  bank: MemoryBank
  agents: AgentConfig
  generator: Any  # AdapterGenerator (or any Generator with an `experts` attribute)
  updater: ModuleUpdater
  experts: Any  # the initial role experts
  training: TrainConfig  # config.train
  image_search: Any = None  # ImageSearch over config.image_search.root (None: no image tool)

  def executor(self, agents: AgentConfig | None = None) -> Executor:
    return Executor(self.generator, self.searcher, agents or self.agents,
                    image_search=self.image_search)

  def memory_build_agents(self) -> AgentConfig:
    """The agents' settings of memory building's episodes and summaries:
    `memory_build.temperature` and `memory_build.top_p` (None or absent: the agents'). A small
    model sampled at 1 garbles the names it copies, so a demo on one builds its memories at a
    lower temperature, or cuts the sampled tail with top-p."""
    agents = self._agents_at("memory_build", "temperature")
    return self._agents_at("memory_build", "top_p", field="top_p", agents=agents)

  def evolving_agents(self) -> AgentConfig:
    """The agents' settings when the Distiller writes skills outside its own training stage
    (memory building, TTRL's per-batch evolution): `memory.evolve_temperature` (None: the
    agents' temperature). The skill document is a bank edit, not a rollout to learn from."""
    return self._agents_at("memory", "evolve_temperature")

  def _agents_at(self, section: str, key: str, field: str = "temperature",
                 agents: AgentConfig | None = None) -> AgentConfig:
    """`agents` (default: the experiment's) with the sampling `field` (temperature / top_p)
    config.<section>.<key> gives (None or absent: theirs)."""
    agents = agents or self.agents
    value = self.config[section].get(key)
    if value is None:
      return agents
    rule, ok = _SAMPLING_FIELDS[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
      raise ValueError(f"config.{section}.{key} must be {rule} or None, got {value!r}")
    return dataclasses.replace(agents, **{field: float(value)})


# AgentConfig's sampling fields a config section may set for one phase: (rule, check)
_SAMPLING_FIELDS = {"temperature": ("a number >= 0", lambda v: v >= 0),
                    "top_p": ("in (0, 1]", lambda v: 0 < v <= 1)}


def world_questions_of(world: World, categories) -> list:
  """The world's questions of `categories` (data.categories; empty: all), in order: a demo
  about the procedure categories asks mostly those."""
  categories = tuple(categories)
  unknown = [x for x in categories if x not in CATEGORIES]
  if unknown:
    raise ValueError(f"config.data.categories: {unknown[0]!r} is not one of "
                     f"{', '.join(CATEGORIES)}")
  kept = [e for e in world.examples if not categories or e.category in categories]
  if not kept:
    raise ValueError(f"config.data.categories {categories!r}: the world has no such question")
  return kept


def load_data(c) -> tuple[list, list, list]:
  """(train, test, passages): `data_and_world`'s without the world."""
  return data_and_world(c)[:3]


def data_and_world(c) -> tuple[list, list, list, World | None]:
  """(train, test, passages, the World for a `world` source else None) of the synthetic world, of a folder World.write wrote, or of
  HotpotQA / 2WikiMultiHopQA (data.folder: the official file folder; data.train_split /
  data.test_split; read through `apex_jax.datasets.sources`: array_record, random access,
  built once under data.cache_dir). For the official sets the passages (the word / ngram
  searches' corpus) are the questions' own context paragraphs, first text per title."""
  kind = choice(c.data.source, "data.source", SOURCES)
  world = None
  if kind == "world":
    world = World.generate(c.data.world_seed, c.data.entities, c.data.questions,
                           procedures=c.data.get("procedures", False),
                           image_share=c.data.get("image_share", 0.0))
    train, test = split_examples(world_questions_of(world, c.data.get("categories", ())),
                                 c.data.test_fraction, c.data.world_seed)
    passages = world.passages
  elif kind in ("hotpotqa", "twowiki") + sources.IMAGE_SETS:
    cache = c.data.get("cache_dir") or None
    train, test = (sources.source(kind, c.data.folder, c.data.get(f"{s}_split", s),
                                  cache_dir=cache) for s in ("train", "test"))
    passages = []
    if c.search.kind != "index":  # only the in-process searches need the passages
      seen = {}
      for ex in list(train) + list(test):
        for p in ex.passages:
          seen.setdefault(p.title, p)
      passages = list(seen.values())
  else:
    corpus = os.path.join(c.data.folder, "corpus.jsonl")
    passages = list(read_corpus(corpus))
    by_id = {p.id: p for p in passages}
    train, test = (read_examples(os.path.join(c.data.folder, f"{s}.jsonl"), by_id)
                   for s in ("train", "test"))
  if not train or not test:
    raise ValueError(f"config.data gives {len(train)} train and {len(test)} test questions; "
                     f"both splits must be non-empty")
  return train, test, passages, world


def _searcher(c, passages):
  kind = choice(c.search.kind, "search.kind", SEARCHES)
  if kind in ("word", "ngram"):
    return (WordSearch if kind == "word" else NgramSearch)(passages, topk=c.search.topk)
  return LocalSearch(c.search.index, topk=c.search.topk)


def _embedder(c, model):
  if choice(c.memory.embedder, "memory.embedder", EMBEDDERS) == "backbone_mean":
    return BackboneMeanEmbedder(model.params.embed, model.tokenizer)
  return SentenceEmbedder(c.memory.embedder_path or None)


def build(config, *, model: llm.Model | vl.VlModel | None = None, generator=None,
          embedder=None) -> Experiment:
  """The experiment's pieces. model: already loaded (else config.model.path; a Qwen2.5-VL one
  gets `VlGenerator` and `VlModuleUpdater`); generator: a stand-in sampler (tests), else an
  AdapterGenerator with the three role experts; embedder: the memory bank's (else
  config.memory.embedder)."""
  c = config
  check_paths(c, model_given=model is not None)
  if model is None:
    model = load_backbone(c.model.path, c.model.dtype)
  # a Qwen2.5-VL backbone: the agents sample and learn with the images; `Experiment.model` is
  # its language model (tokenizer, embedder, adapters' export)
  vl_model = model if isinstance(model, vl.VlModel) else None
  model = model.text if vl_model else model
  train, test, passages, world = data_and_world(c)
  lora = lora_config(c)
  experts = lora_lib.init_experts(lora, model.config, jax.random.PRNGKey(c.seed))
  training = train_config(c)
  agents = settings(AgentConfig, c.agents, "agents")
  updating = dict(step=training.step, recompute_logp_old=agents.top_p < 1.0)
  if vl_model is not None:  # model.image_size: the images' size bucket (448: the authors')
    size = c.model.get("image_size", IMAGE_SIZE)
    generator = generator or VlGenerator(vl_model, experts, lora, image_size=size)
    updater = VlModuleUpdater.of(vl_model, lora, image_size=size, **updating)
  else:
    generator = generator or AdapterGenerator(model, experts, lora, engines=agents.engines())
    updater = ModuleUpdater(model, lora, **updating)
  os.makedirs(c.workdir, exist_ok=True)
  bank = MemoryBank(c.memory.path or fresh_bank_path(c.workdir), embedder or _embedder(c, model),
                    config=settings(MemoryConfig, c.memory.bank, "memory.bank"))
  return Experiment(c, model, train, test, _searcher(c, passages), bank, agents, generator,
                    updater, experts, training,
                    # a world's questions are lists; the official sets' are lazy sources
                    image_searcher(c, world, list(train) + list(test) if world else ()))


def load_backbone(path: str, dtype: str):
  """config.model.path's backbone: a `vl.VlModel` for a Qwen2.5-VL folder, else an
  `llm.Model`."""
  if vl.is_vl_folder(path):
    return vl.load(path, dtype=jnp.dtype(dtype))
  return llm.load(path, dtype=dtype)


def image_searcher(c, world: World | None = None, examples=()) -> ImageSearch | None:
  """The image questions' tool: config.image_search.root's results cache (the authors'
  layout); with no root, for a `world` source with image questions, the cache the world writes
  for them into <workdir>/image_search (`world_images.write_entry`: the match, then the nearest
  emblems); None without either, or when config.image_search.enabled is False (the
  without-image-search rows: image questions keep their image, no tool is offered)."""
  section = c.get("image_search") or {}
  enabled = section.get("enabled", True)
  if not isinstance(enabled, bool):
    raise ValueError(f"config.image_search.enabled must be a bool, got {enabled!r}")
  results = section.get("max_results", world_images.RESULTS)
  root = section.get("root", "")
  if not enabled:
    return None
  if not root:
    asked = [e for e in examples if e.images]
    if world is None or not asked:
      return None
    try:
      world_images.check_results(results)
    except ValueError as err:
      raise ValueError(f"config.image_search.max_results: {err}") from None
    root = os.path.join(c.workdir, world_images.SEARCH_FOLDER)
    for example in asked:
      world_images.write_entry(world, root, example, results)
  if not os.path.isdir(root):
    raise ValueError(f"config.image_search.root {root!r} is not a folder")
  return ImageSearch(root, max_results=results)


def train_config(c) -> TrainConfig:
  """config.train; the update is GRPO's."""
  return settings(TrainConfig, c.train, "train", step={"estimator": "grpo"})


def lora_config(c) -> lora_lib.LoraConfig:
  """config.lora with APEx's roles (LORA_SET_ELSEWHERE)."""
  return settings(lora_lib.LoraConfig, c.lora, "lora", roles=APEX_ROLES, num_subtask_experts=0)


def _field(c, dotted: str):
  value = c
  for part in dotted.split("."):
    value = value.get(part) if hasattr(value, "get") else None
  return value


def check_paths(c, *, model_given: bool = False) -> None:
  """Refuses, naming the field, every path the run needs that the config leaves empty: the
  model (unless one is given), the ones `config.required` lists (configs/apex/paper.py: the
  paths the user gives), the data folder, the search index, the judge server, and a separate
  judge model that does not exist."""
  needed = [] if model_given else ["model.path"]
  needed += [f for f in c.get("required", ()) if f != "model.path" or not model_given]
  if c.data.source != "world":
    needed.append("data.folder")
  if c.search.kind == "index":
    needed.append("search.index")
  if c.judges.kind == "http":
    needed.append("judges.url")
  for name in dict.fromkeys(needed):
    if not _field(c, name):
      raise ValueError(f"config.{name} is empty: give it (--config.{name}=..., or through the "
                       f"config file's argument, e.g. configs/apex/paper.py:model=...)")
  judge = c.judges.get("path")
  if judge and not os.path.exists(judge):
    raise ValueError(f"config.judges.path {judge!r} does not exist")


def agents_for(exp: "Experiment", phase: Phase, where: str = "phase") -> AgentConfig:
  """The agents' settings inside one stage or TTRL (at config.<where>): the experiment's, with
  the phase's `agents` overrides; none given: the experiment's own."""
  if not phase.agents:
    return exp.agents
  return settings(AgentConfig, {**section(exp.agents), **phase.agents}, f"{where}.agents")


def fresh_bank_path(workdir: str, name: str = "memory") -> str:
  """<workdir>/<name>.db, emptied: a run's own bank starts empty, so running a config twice gives
  the same numbers (a bank to build on is named by memory.path, and kept)."""
  path = os.path.join(workdir, f"{name}.db")
  for stale in (path, path + "-wal", path + "-shm", path + "-journal"):
    if os.path.exists(stale):
      os.remove(stale)
  return path
