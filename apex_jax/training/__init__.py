"""APEx training: rewards (pure functions), one-module GRPO updates, the three-stage alternating
GRPO (executor -> distiller -> planner) and skill-guided test-time RL (planner only).

  updater = ModuleUpdater(model, lora)  # model: llm.Model; roles: planner, executor, distiller
  stages = [Stage(StageConfig("executor", ...), data, rollout_fn), ...]  # then distiller, planner
  result = run_stages(updater, experts, stages, generator, rng=key, logdir="runs/apex")
  ttrl = run_ttrl(updater, result.experts, queries, bank, generator, episode_fn, judges,
                  distill_fn, config=TtrlConfig(...), rng=key)
"""

from apex_jax.training.grpo import ModuleUpdater, VlModuleUpdater, keep_only_expert, packed_batch
from apex_jax.training.rewards import (Reward, distiller_reward, executor_reward, planner_reward,
                                       skill_gate, skill_lambda, ttrl_reward)
from apex_jax.training.stages import STAGE_ORDER, Stage, StageConfig, StagesResult, run_stages
from apex_jax.training.ttrl import (JudgeBackends, Judges, PlannerEpisode, Query, TtrlConfig,
                                    TtrlResult, run_ttrl)

__all__ = [
    "JudgeBackends", "Judges", "ModuleUpdater", "PlannerEpisode", "Query", "Reward",
    "VlModuleUpdater", "STAGE_ORDER", "Stage", "StageConfig", "StagesResult", "TtrlConfig",
    "TtrlResult", "distiller_reward", "executor_reward", "keep_only_expert", "packed_batch",
    "planner_reward", "run_stages", "run_ttrl", "skill_gate", "skill_lambda", "ttrl_reward",
]
