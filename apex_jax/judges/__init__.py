"""APEx's judges: rule-based scores, an LLM correctness judge, the no-ground-truth judge of
test-time RL (three evaluators + arbiter), skill alignment; and their chat backends (an
OpenAI-compatible HTTP client, or a model in process) with `serving.py`, the server behind
`launchers.serve`.

The in-process backend (AdapterRoute, Completion, InProcessChat) is imported on first use, so
that the rule and HTTP judges do not pay for importing jax.
"""

import importlib

from apex_jax.judges.align import AlignConfig, AlignJudge, Alignment, has_guidance
from apex_jax.judges.chat import (ChatBackend, ChatClient, JudgeError, JudgeRequestError,
                                  JudgeResponseError, JudgeTimeout, JudgeUnavailable,
                                  complete_many)
from apex_jax.judges.llm_judge import Judgement, LlmJudge, LlmJudgeConfig
from apex_jax.judges.nogt import (Candidate, EvaluatorResult, NoGtConfig, NoGtJudge,
                                  NoGtJudgement, format_trajectory, weighted_score)
from apex_jax.judges.rule import exact_match, f1, normalize_answer
from apex_jax.judges.skill_judge import SkillItem, SkillJudge, SkillJudgeConfig

__all__ = ["AlignConfig", "AlignJudge", "Alignment", "has_guidance", "ChatBackend", "ChatClient",
           "JudgeError", "JudgeRequestError", "JudgeResponseError", "JudgeTimeout",
           "JudgeUnavailable", "complete_many", "AdapterRoute", "Completion", "InProcessChat",
           "Judgement", "LlmJudge", "LlmJudgeConfig", "Candidate", "EvaluatorResult",
           "NoGtConfig", "NoGtJudge", "NoGtJudgement", "format_trajectory", "weighted_score",
           "exact_match", "f1", "normalize_answer", "SkillItem", "SkillJudge", "SkillJudgeConfig"]


_LAZY = {"AdapterRoute", "Completion", "InProcessChat"}


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module("apex_jax.judges.inprocess"), name)
  raise AttributeError(f"module 'apex_jax.judges' has no attribute {name!r}")
