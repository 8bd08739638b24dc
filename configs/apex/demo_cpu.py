"""The APEx CPU demo: memory building, the three GRPO stages and TTRL on a synthetic multi-hop
world with the committed APEx toy backbone, then the ablation table, on 2 CPU cores.

  python -m launchers.train --config=configs/apex/demo_cpu.py
  config = demo_cpu.get_config("/path/to/model")      # another local Hugging Face folder

The toy (assets/toy_apex, README: how it was made) was taught the compact APEx formats and the
TTRL judges' replies on worlds 0-7, 1000-1007, 2000-2007 and 3000-3007 with 2 passages per
search; this world (seed 777) has names none of those had, and the agent settings here
(compact prompts, topk 2, no memories in the replan prompt) are the ones its training
conversations were rendered with.
"""

import os

import ml_collections

from apex_jax.agents import AgentConfig
from apex_jax.experiment import LORA_SET_ELSEWHERE, StagePhase, TrainConfig, TtrlPhase
from apex_jax.memory import MemoryConfig
from morse_jax.config_sections import section
from morse_jax.lora.experts import LoraConfig
from morse_jax.rl.train_step import StepConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stage(steps, lr, max_new_tokens, batch_size=4, group_size=4):
  return section(StagePhase, exclude=("module",), steps=steps, batch_size=batch_size,
                 group_size=group_size, learning_rate=lr, temperature=1.0,
                 max_new_tokens=max_new_tokens)


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.system = "apex"  # launchers.train dispatches on it (-> apex_jax.pipeline.run)
  c.seed = 0
  c.seeds = ()  # (s1, s2, ...): the whole chain once per seed (apex_jax.seeds); (): once at seed
  c.seed_workers = 1  # seeds run at once, each in its own process (apex_jax.seeds)
  c.seed_worlds = False  # True: seed s reads world data.world_seed + s (apex_jax.seeds)
  c.workdir = "/tmp/apex_runs/demo_cpu"
  c.compilation_cache = "~/.cache/morse_jax/xla"  # JAX's persistent cache, as the MoRSE configs; "": off
  # XLA:CPU's intra-op threads whatever the machine's cores: a reduction split over another
  # number of threads ends in other bits, which training turns into other samples; the committed
  # tables ran with 2 (docs/RESULTS.md, "Reproducible runs"); 0: one per core (XLA's default)
  c.cpu_threads = 2
  c.model = dict(path=arg or os.path.join(ROOT, "assets", "toy_apex"), dtype="float32")
  # "world": generated in memory; "folder": train/test/corpus.jsonl as World.write writes them
  # procedures: the world's career / property facts in records whose right one only experience
  # tells (apex_jax.datasets.world_records; the committed toy was not trained on such worlds)
  # image_share: that share of the chain questions ask about an entity's emblem instead of naming
  # it (apex_jax.datasets.world_images); their image-search cache is written into the workdir
  # (config.image_search)
  c.data = dict(source="world", folder="", world_seed=777, entities=120, questions=64,
                test_fraction=0.25, procedures=False, categories=(), image_share=0.0)
  # "ngram": the trigram search (misspelled names still find their passage); "word": exact words;
  # "index": LocalSearch over a built index
  c.search = dict(kind="ngram", index="", topk=2)
  # the image questions' web_image_to_image_search: root "" and a world with image questions:
  # the cache the world writes into <workdir>/image_search; enabled False: no tool offered
  c.image_search = dict(root="", enabled=True, max_results=3)
  # bank.text_image False: captions stay out of the bank (every memory text-only)
  # evolve_temperature: the Distiller writes skills greedily outside its own stage (memory
  # building, TTRL's evolution); sampled at 1, the toy's replies lose a field or the JSON
  c.memory = dict(embedder="backbone_mean", embedder_path="", path="",  # "": a new one in workdir
                  evolve_temperature=0.0,
                  bank=section(MemoryConfig(k=2, k_replan=1, evolve_every=4, evolve_min_size=2,
                                            evolve_window=8)))
  c.lora = section(LoraConfig(targets=("q", "v", "o"), last_n_layers=2, rank=8, alpha=16.0),
                   exclude=LORA_SET_ELSEWHERE)
  # checkpoint_every: the stages save every n updates (0: at each stage's end), TTRL every n
  # steps with a snapshot of the memory bank; a killed run resumes (experiment.run)
  # step: every StepConfig field the stages do not set; aggregation / advantage_clip /
  # min_reward_std: ours (token-mean, clip 5, flat below 5e-4); configs/apex/paper.py has the
  # paper's (seq-mean-token-mean, 0: no clip, 0.0)
  # micro_batches: a planner update of 16 rows x 2048 tokens took more than 20 GB in one pass on
  # XLA:CPU (attention products in f32; the procedure demo was killed for memory); in 4 passes
  # the run peaks at 5.5 GB. The gradient is the same (one denominator for the whole batch).
  c.train = section(TrainConfig(checkpoint_every=1, step=StepConfig(
      aggregation="token-mean", advantage_clip=5.0, min_reward_std=5e-4, micro_batches=4)))
  c.agents = section(AgentConfig(max_turns=5, max_llm_calls=10, max_tool_tokens=512,
                                 max_context_tokens=2048, topk=2, planner_max_new_tokens=96,
                                 executor_max_new_tokens=80, distiller_max_new_tokens=400,
                                 temperature=1.0, top_p=1.0, prompts="compact",
                                 replan_memories=False))
  # temperature / top_p: memory building's episodes and summaries (None: the agents')
  c.memory_build = dict(questions=12, batch_size=6, force_evolve=True,
                        temperature=ml_collections.config_dict.placeholder(float),
                        top_p=ml_collections.config_dict.placeholder(float))
  c.stages = dict(executor=_stage(6, 1e-3, 80), distiller=_stage(2, 1e-3, 320, batch_size=2),
                  planner=_stage(3, 1e-3, 96))
  # store: "all" judged episodes become memories (ours) or "best", each query's best one (our
  # reading of the paper's "selected" episodes; apex_jax.training.ttrl.TtrlConfig)
  c.ttrl = section(TtrlPhase, steps=2, batch_size=4, group_size=4, learning_rate=1e-4,
                   temperature=1.0, max_new_tokens=96, summarize=True, checkpoint_every=1,
                   store="all")
  # accuracy / skill_quality / skill_terms "judge" (the paper's: an LLM judge on this backend) or "rule": the
  # toy was taught the TTRL judges' replies but not the correctness or skill grades, so the
  # stages score answers by EM and skills by the rule-based quality (apex_jax.training.judging)
  c.judges = dict(kind="inprocess", url="", model="", max_tokens=32, accuracy="rule", rule="em",
                  skill_quality="rule", skill_terms="rule")
  # ablations: the table's rows (apex_jax.ablations.ABLATIONS); () gives every row
  # untrained: the untrained system's row (initial experts, built memories) before the table
  # rebuild_module_banks: each w/o <module> training row reruns TTRL with that module's initial
  # adapter, so it reads the bank that system builds (apex_jax.pipeline); False: the adapter
  # swapped into the full system, reading the full bank (cheaper: no TTRL rerun per row)
  # baselines: the comparison systems' rows after the table (apex_jax.baselines.SYSTEMS;
  # configs/apex/baselines.py), each on the initial experts with its own bank
  c.eval = dict(questions=16, batch_size=16, temperature=0.0, ablations=(),
                untrained=True, rebuild_module_banks=True, baselines=())
  return ml_collections.ConfigDict(c)
