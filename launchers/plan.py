"""Precompute the planner's subtask graphs for a dataset split (JSONL), to reuse in runs.

  python -m launchers.plan --config=configs/morse/srdd.py:mole_hgrpo,qwen3_4b,gpu8 \
      --config.model.path=/ckpt/Qwen3-4B-Instruct-2507 --config.task.path=/data/srdd.csv \
      --out=/data/srdd_plans.jsonl
  python -m launchers.train --config=... --config.task.plans=/data/srdd_plans.jsonl
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Where to write the plans (JSONL).", required=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "test"], "Which category split.")


def main(argv):
  del argv
  from morse_jax.experiments import pipeline

  stats = pipeline.plan(_CONFIG.value, _OUT.value, _SPLIT.value)
  pipeline.banner("done")
  print(f"wrote {_OUT.value}: {stats}")


if __name__ == "__main__":
  app.run(main)
