"""MoRSE's untrained systems beside the paper's prompt-level baselines on HumanEval (issue 57):
`single`, `morse_base`, ChatChain, MacNet and AFlow on one frozen backbone, each measured once,
with a paired sign-flip test of each against `morse_base` over problems
(`morse_jax.experiments.table2`; nothing is trained). `get_config("backbone,hardware")`,
default Qwen2.5-Coder-1.5B-Instruct on the CPU (`make real-model-qwen` writes it):

  python -m launchers.train --config=configs/morse/table2_baselines.py --config.task.limit=20
"""

import ml_collections

from configs.morse import common

SYSTEMS = ("single", "morse_base", "chatchain", "macnet", "aflow")


def get_config(arg=None):
  backbone, hardware = (arg or "qwen25_coder_15b,cpu").split(",")
  c = common.apply(common.base(), f"morse_base,{backbone},{hardware}", "humaneval")
  c.workdir = f"/tmp/morse_runs/table2_baselines_{backbone}"
  c.table2 = ml_collections.ConfigDict(dict(
      variants=SYSTEMS, seeds=(0,), steps=0,
      # (a, b): a - b, paired over the held-out problems (and nodes where both have one per problem)
      comparisons=tuple((v, "morse_base") for v in SYSTEMS if v != "morse_base")))
  return c
