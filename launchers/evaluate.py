"""Evaluate a MoRSE system (or a baseline) on a task family's test split.

  python -m launchers.evaluate --config=configs/morse/humaneval_canonical.py
  python -m launchers.evaluate --config=configs/morse/scicode.py:morse_base,qwen3_4b,gpu8 \
      --config.model.path=/ckpt/Qwen3-4B-Instruct-2507 --config.task.path=/data/scicode.json
  python -m launchers.evaluate --config=... --checkpoint=/tmp/morse_runs/x/ckpt   # trained

Writes the summary to <workdir>/eval_<split>.json and, beside it, eval_<split>.jsonl: one line
per node (reply, extracted code, reward, the verifier's reason, route, tokens, seconds) and one
per problem; --record_prompts adds each executor prompt's text.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Training checkpoints to evaluate (latest).")
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "test", "all"],
                           "Which category split (all: every problem).")
_RECORD_PROMPTS = flags.DEFINE_bool("record_prompts", False,
                                    "Put each executor prompt's text in eval_<split>.jsonl "
                                    "(config.eval.record_prompts).")


def main(argv):
  del argv
  from morse_jax.experiments import pipeline

  config = _CONFIG.value
  if _RECORD_PROMPTS.value:
    config.eval.record_prompts = True
  summary = pipeline.canonical(config) if config.task.oracle == "canonical" else (
      pipeline.evaluate(config, _CHECKPOINT.value, _SPLIT.value))
  pipeline.banner("result")
  for k, v in summary.items():
    print(f"{k:<24} {v:.4f}" if isinstance(v, float) else f"{k:<24} {v}")
  os.makedirs(config.workdir, exist_ok=True)
  path = os.path.join(config.workdir, f"eval_{_SPLIT.value}.json")
  with open(path, "w") as f:
    json.dump(summary, f, indent=2)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
