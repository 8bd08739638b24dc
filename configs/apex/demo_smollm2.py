"""The APEx chain on 2 CPU cores with SmolLM2-135M-Instruct as the backbone:
memory building, then held-out EM / F1 for full, without memories and without skills, on the
demo's synthetic world (configs/apex/demo_cpu.py: seed 777, 48 training and 16 held-out
questions, trigram search with 2 passages).

  python -m launchers.train --config=configs/apex/demo_smollm2.py
  python -m launchers.train --config=configs/apex/demo_smollm2.py:/path/to/SmolLM2-135M-Instruct

The model folder defaults to the `make real-model` one (~/.cache/morse_jax/models/
SmolLM2-135M-Instruct). SmolLM2 is ~64x the toy's parameters, so the chain is shrunk toward
20 minutes (seed 0 took 34 CPU-minutes, 45 min of wall time beside other jobs): no GRPO stage
and no TTRL (steps 0: the ablation compares the untrained system's use of its memories and
skills), no separate untrained row (it would equal "full"), shorter turns, greedy held-out
evaluation (deterministic). Memory building scores outcomes with
the rule (EM): SmolLM2-135M as its own judge would be a coin, and the paper's judge is a 32B
model (`--config.judges.accuracy=judge --config.judges.kind=http --config.judges.url=...`).
docs/RESULTS.md, "The APEx demo": what it measured (untrained SmolLM2-135M writes no valid executor turn,
so every row is 0 EM / 0 F1; `make demo-apex` stays on the toy).
"""

import os

from configs.apex import demo_cpu

DEFAULT_MODEL = os.path.join(os.path.expanduser("~"), ".cache", "morse_jax", "models",
                             "SmolLM2-135M-Instruct")


def get_config(arg=None):
  c = demo_cpu.get_config(arg or DEFAULT_MODEL)
  c.workdir = "/tmp/apex_runs/demo_smollm2"
  # compact prompts: apex_jax.toy.evaluate --prompts=compact|authors measured both (README):
  # under the authors' text SmolLM2 echoes the system prompt until the turn is cut; under the
  # compact one it answers in plain words (no tags) and its replan decision parses 5 of 12
  # times (1 of 12 with the authors'); and it is ~5x cheaper (shorter prompts)
  c.agents.update(prompts="compact", max_context_tokens=4096, planner_max_new_tokens=96,
                  executor_max_new_tokens=96, distiller_max_new_tokens=400)
  c.memory_build.update(questions=16, batch_size=8)
  for module in ("executor", "distiller", "planner"):
    c.stages[module].steps = 0
  c.ttrl.steps = 0
  c.eval.update(questions=16, batch_size=16, temperature=0.0, untrained=False,
                ablations=("full", "without_memories", "without_skills"))
  return c
