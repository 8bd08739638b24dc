"""APEx's agents: the Executor's multi-turn search loop, the Planner (plan, evaluate, replan,
episodes) and the Distiller (skill synthesis / evolution, workflow summaries), all batched: each
round, every active question of a module generates in one sampler call."""

from apex_jax.agents.config import AgentConfig, AgentConfigError
from apex_jax.agents.distiller import Distiller, Evolution, Summary
from apex_jax.agents.episode import Episode, run_episode
from apex_jax.agents.executor import Executor
from apex_jax.agents.generator import (APEX_ROLES, AdapterGenerator, Generation, Generator,
                                       SeparateGenerator, chat_tokens)
from apex_jax.agents.planner import Decision, Planner, PlannerRun, parse_decision
from apex_jax.agents.trajectory import MODULES, Trajectory

__all__ = ["APEX_ROLES", "AdapterGenerator", "AgentConfig", "AgentConfigError", "Decision",
           "Distiller", "Episode", "Evolution", "Executor", "Generation", "Generator", "MODULES",
           "Planner", "PlannerRun", "SeparateGenerator", "Summary", "Trajectory", "chat_tokens",
           "parse_decision", "run_episode"]
