"""The paper's comparisons as experiment settings: variant -> the config's `system`, `mixture`
and `algo` (`experiment` says what each value means) and the updates a run of it trains:

  single      one agent, one call per task, bare backbone        (evaluation only)
  morse_base  planner + Merger + Executor, untrained experts      (evaluation only)
  fixed_grpo  MoRSE with one fixed LoRA per role (rank r(1+K), no router), GRPO
  mole_grpo   MoRSE with role + routed subtask experts, GRPO
  mole_hgrpo  MoRSE with role + routed subtask experts, HGRPO     (the paper's method)
  chatchain   ChatDev's ChatChain phases on the bare backbone    (evaluation only)
  macnet      MacNet: agents on a DAG critique, refine, aggregate (evaluation only)
  aflow       AFlow's HumanEval workflow, run fixed              (evaluation only)

The last three are the paper's prompt-level baselines (`morse_jax.baselines`): same backbone,
verifier, token limit per call and records as `single`.

A config file applies one (`configs/morse/common.apply`); Table 2 runs several (`table2`).
"""

from __future__ import annotations

VARIANTS = {
    "single": dict(system="single", mixture="none", algo="grpo", steps=0),
    "morse_base": dict(system="morse", mixture="mole", algo="hgrpo", steps=0),
    "fixed_grpo": dict(system="morse", mixture="fixed", algo="grpo", steps=200),
    "mole_grpo": dict(system="morse", mixture="mole", algo="grpo", steps=200),
    "mole_hgrpo": dict(system="morse", mixture="mole", algo="hgrpo", steps=200),
    "chatchain": dict(system="chatchain", mixture="none", algo="grpo", steps=0),
    "macnet": dict(system="macnet", mixture="none", algo="grpo", steps=0),
    "aflow": dict(system="aflow", mixture="none", algo="grpo", steps=0),
}
