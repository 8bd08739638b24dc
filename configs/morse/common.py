"""Shared settings of the MoRSE experiment configs. A config file's `get_config(arg)` starts from
`base()` and applies a variant, a backbone and a hardware preset:

  --config=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,gpu8

variants: the paper's comparisons, single, morse_base, fixed_grpo, mole_grpo, mole_hgrpo, and
its prompt-level baselines chatchain, macnet, aflow (evaluation only; `config.baseline` holds their
settings) (`morse_jax.experiments.variants`, which says what each runs).
backbones: qwen3_4b (Qwen3-4B-Instruct-2507), llama31_8b (Llama-3.1-8B-Instruct): give the
checkpoint folder with --config.model.path; smollm2_135m (SmolLM2-135M-Instruct, the real model
that installs offline: `make real-model` writes it to SMOLLM2_PATH, its default path; float32),
qwen25_coder_15b (Qwen2.5-Coder-1.5B-Instruct, offline too: `make real-model-qwen` writes it to
QWEN25_CODER_15B_PATH; bfloat16).
hardware: cpu (1 device), gpu8 (one 8-GPU host), tpu_v5e8 (a v5e-8 slice). The accelerator
presets recompute each layer in the update's backward pass (train.step.remat) and split the
update into micro-batches so that it fits: `python -m launchers.fit --config=...` compiles the update
and the sampler at the run's shapes on 8 fake CPU devices and prints per-device bytes
(docs/RESULTS.md has the table for the paper's runs).
"""

from __future__ import annotations

import ml_collections

from morse_jax.config_sections import section
from morse_jax.baselines.run import BaselineConfig
from morse_jax.experiments.variants import VARIANTS
from morse_jax.experiments.experiment import RoutingConfig, TrainConfig
from morse_jax.llm.sampling import SamplingConfig
from morse_jax.lora.experts import LoraConfig

# backbone -> (model name, default folder ("": the user gives --config.model.path), dtype)
SMOLLM2_PATH = "~/.cache/morse_jax/models/SmolLM2-135M-Instruct"
QWEN25_CODER_15B_PATH = "~/.cache/morse_jax/models/Qwen2.5-Coder-1.5B-Instruct"
BACKBONES = {"qwen3_4b": ("Qwen3-4B-Instruct-2507", "", "bfloat16"),
             "llama31_8b": ("Llama-3.1-8B-Instruct", "", "bfloat16"),
             # 135M parameters: float32 keeps it equal to transformers' float logits.
             "smollm2_135m": ("SmolLM2-135M-Instruct", SMOLLM2_PATH, "float32"),
             # 1.78B parameters: 3.5 GB in bfloat16 (7 GB in float32).
             "qwen25_coder_15b": ("Qwen2.5-Coder-1.5B-Instruct", QWEN25_CODER_15B_PATH,
                                  "bfloat16")}
# data, model, micro-batches, remat. v5e has 16 GiB per chip: 16 micro-batches leave one row
# of 3072 tokens per chip and pass (launchers.fit).
HARDWARE = {"cpu": (1, 1, 1, False), "gpu8": (8, 1, 1, True), "tpu_v5e8": (4, 2, 16, True)}


def base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "/tmp/morse_runs/default"
  c.demo = False  # launchers.train: evaluate before and after training, and plot
  # JAX's persistent compilation cache: a second run skips most compiles ("" turns it off).
  c.compilation_cache = "~/.cache/morse_jax/xla"
  # XLA:CPU's intra-op threads (morse_jax.runtime.use_cpu_threads); 0: one per core.
  # A run's last bits follow the count (docs/RESULTS.md, "Reproducible runs")
  c.cpu_threads = 0
  c.system, c.mixture, c.algo = "morse", "mole", "hgrpo"
  c.max_nodes = 12
  c.planner_max_new_tokens = 512
  c.model = ml_collections.ConfigDict(dict(path="", dtype="bfloat16", name=""))
  c.task = ml_collections.ConfigDict(dict(family="humaneval", path="", plans="", limit=0,
                                          skip=0,  # the split's first `skip` problems left out
                                          oracle="", holdout=8,  # SRDD: held-out categories
                                          num_problems=0, seed=0,  # synthetic: the suite
                                          # synthetic: 0 the suite's 2-6-node graphs; N > 0
                                          # the easy tier of N-node chains
                                          steps=0,
                                          holdout_categories=("string_analysis",),
                                          # synthetic: "category" holds the categories out of
                                          # training; "instance" trains and tests on disjoint
                                          # problems that contain them (test: the first
                                          # test_problems)
                                          split="category", test_problems=24,
                                          # SciCode: "ood" trains on Physics + Math + Material
                                          # Science and tests on Chemistry + Biology;
                                          # "in_domain": the authors' stratified 60 / 20
                                          scicode_split="ood",
                                          targets_h5="",  # SciCode: test_data.h5 ("": none)
                                          # HumanEval: the executor's reply starts with the
                                          # prompt's code, which the model completes
                                          reply_prefix=False))
  # The authors' layout: q, v, o in the last 8 layers, r 8, alpha 16, 2 roles + 4 subtask experts
  # (every LoraConfig field but the roles, which are the system's).
  c.lora = section(LoraConfig(targets=("q", "v", "o"), last_n_layers=8, rank=8, alpha=16.0,
                              num_subtask_experts=4), exclude=("roles",))
  # log_prob: "plackett_luce" (the paper's log pi(E)), "sum_log_p" (the reference code's) or
  # "distinct_plackett_luce" (the probability of the draw as made: the B routes of a node are
  # redrawn up to max_resample times until their sets differ; max_resample 0: no redraw, where
  # plain Plackett-Luce is exact). proto_l2 / orthogonality / diversity: ours, added to the
  # router loss; 0 each gives the paper's plain -alpha_pi sum_b A_cross_b log pi(E_b).
  # embedder: the router's input ("backbone_mean" or "sentence"); the rest: RouterConfig's fields
  # (experiment.RoutingConfig).
  c.router = section(RoutingConfig(dim=128, top_k=2, log_prob="plackett_luce",
                                   merge_experts="union", max_resample=8, proto_l2=1e-4,
                                   orthogonality=0.05, diversity=0.02, embedder="backbone_mean"))
  # experiment.TrainConfig: the rollout (B routes_per_node, M group_size, max_new_tokens,
  # sampling.temperature / top_p / top_k, the mixture kernels while sampling and in the update;
  # share_prompts: the update runs each route's prompt once, not once per candidate: same
  # numbers, about M times fewer prompt tokens; with micro_batches > 1 it runs rows as they are;
  # without a router the one route gets all B x M samples), the training loop, and the update
  # `train.step`: every StepConfig field but the estimator (config.algo) and the scoring
  # temperature (the rollout's). The step's defaults are the reference code's: advantages
  # clipped to +-5 (0: no clip; in neither paper), a node whose reward std is below 5e-4 skipped
  # (0.0: only an exactly flat one), epochs: PPO epochs per rollout (experts; the router takes
  # one step), remat: recompute each layer in the backward pass (the accelerator presets turn
  # it on).
  c.train = section(TrainConfig(routes_per_node=4, group_size=4, max_new_tokens=1024,
                                sampling=SamplingConfig(temperature=1.0), share_prompts=True,
                                steps=200, tasks_per_step=4, checkpoint_every=20, keep=3,
                                skip_blocked=False, train_merges=True, max_minutes=0.0,
                                continue_other_run=False))
  # eval.before: a demo.json whose untrained-system numbers the demo reuses ("": measure them);
  # eval.record_prompts: the eval records (eval_<split>.jsonl) also hold each executor prompt;
  # eval.engine: the tasks' DAGs on the generation engine, each node when its parents are done
  # (`mas/engine_run.py`, the same outcomes), not in waves (`runner.run`); demo_cpu's evaluation:
  # the same records in 44.9 s against 79.5 s (2 shared CPU cores, compile caches warm); the
  # baselines' calls too (`baselines.EngineBackbone`), though at 4 tasks on a CPU the static
  # sampler's rounds were faster (ChatChain, Qwen2.5-Coder-1.5B: 818 s against 1,150; RESULTS)
  c.eval = ml_collections.ConfigDict(dict(max_new_tokens=1024, tasks_per_batch=8, before="",
                                          record_prompts=False, engine=True))
  # The code sandbox (docs/SECURITY.md): "bubblewrap" (required: without it model code does not
  # run) or "reduced" (rlimits only, never root; also chosen by MORSE_SANDBOX=reduced).
  c.verifier = ml_collections.ConfigDict(dict(isolation="bubblewrap"))
  # The baselines' own settings (baselines.run.BaselineConfig): MacNet's topology (chain, star,
  # tree, mesh or random, seeded by config.seed) and agent count, or edges "0->1,0->2" of one's
  # own; AFlow's draft temperature.
  c.baseline = section(BaselineConfig())
  c.mesh = ml_collections.ConfigDict(dict(data=1, model=1))
  c.distributed = ml_collections.ConfigDict(dict(coordinator="", num_processes=0,
                                                 process_id=-1, auto=False))
  return c


def apply(c: ml_collections.ConfigDict, arg: str | None, family: str,
          default: str = "mole_hgrpo,qwen3_4b,cpu") -> ml_collections.ConfigDict:
  variant, backbone, hardware = (arg or default).split(",")
  if variant not in VARIANTS:
    raise ValueError(f"config variant {variant!r} not in {sorted(VARIANTS)}")
  if backbone not in BACKBONES:
    raise ValueError(f"config backbone {backbone!r} not in {sorted(BACKBONES)}")
  if hardware not in HARDWARE:
    raise ValueError(f"config hardware {hardware!r} not in {sorted(HARDWARE)}")
  v = VARIANTS[variant]
  c.system, c.mixture, c.algo, c.train.steps = v["system"], v["mixture"], v["algo"], v["steps"]
  c.model.name, c.model.path, c.model.dtype = BACKBONES[backbone]
  c.mesh.data, c.mesh.model, c.train.step.micro_batches, c.train.step.remat = HARDWARE[hardware]
  c.task.family = family
  c.workdir = f"/tmp/morse_runs/{family}_{variant}_{backbone}"
  return c
