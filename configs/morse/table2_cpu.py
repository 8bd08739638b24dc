"""MoRSE's Table 2 on the CPU demo's suite: the five systems of the paper, the trained ones for
3 seeds with the same number of updates (no time budget), one measurement of each untrained
system, and a paired test per comparison (`morse_jax.experiments.table2`).

  python -m launchers.train --config=configs/morse/table2_cpu.py
  python -m launchers.train --config=configs/morse/table2_cpu.py --config.table2.steps=120
"""

import ml_collections

from configs.morse import demo_cpu


def get_config(arg=None):
  c = demo_cpu.get_config(arg)
  c.demo = False
  # the committed table was measured on the static sampler; the engine's rollouts part from it
  # at a float-order near-tie (demo_cpu: update 56), so a rerun keeps the static path
  c.train.engine = False
  c.workdir = "/tmp/morse_runs/table2_cpu"
  c.table2 = ml_collections.ConfigDict(dict(
      variants=("single", "morse_base", "fixed_grpo", "mole_grpo", "mole_hgrpo"),
      seeds=(0, 1, 2),
      steps=60,  # updates per trained run (a batch's waves may end a few past it)
      # (a, b): a - b, paired over held-out nodes and problems
      comparisons=(("mole_hgrpo", "mole_grpo"), ("mole_hgrpo", "fixed_grpo"),
                   ("mole_grpo", "fixed_grpo"), ("mole_hgrpo", "morse_base"),
                   ("morse_base", "single"))))
  return c
