"""The verifier check: HumanEval's canonical solutions through our sandbox must pass 164/164.

  python -m launchers.evaluate --config=configs/morse/humaneval_canonical.py
"""

from configs.morse import common


def get_config(arg=None):
  del arg
  c = common.apply(common.base(), "single,qwen3_4b,cpu", "humaneval")
  c.task.oracle = "canonical"  # artifacts are the canonical solutions; no model is loaded
  c.workdir = "/tmp/morse_runs/humaneval_canonical"
  return c
