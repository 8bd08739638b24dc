"""The verifier check on SciCode: the gold code of every step of the 15 dev problems (50 steps,
problems_dev.jsonl of nvidia-scicode) through our sandbox must pass every step, with targets
computed from that gold code (scicode_gold; cached in ~/.cache/morse_jax/scicode_targets).

  python -m launchers.evaluate --config=configs/morse/scicode_canonical.py
"""

from configs.morse import common


def get_config(arg=None):
  del arg
  c = common.apply(common.base(), "single,qwen3_4b,cpu", "scicode")
  c.task.oracle = "canonical"  # artifacts are the gold code of each step; no model is loaded
  c.workdir = "/tmp/morse_runs/scicode_canonical"
  return c
