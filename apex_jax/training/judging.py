"""The judges of an experiment, from `config.judges` (configs/apex/*.py):

  kind          "inprocess": the backbone itself, bare (or `path`: a separate judge model), or
                "http": any OpenAI-compatible server at `url` serving `model`. One chat backend
                per experiment, shared by every judge below (`judge_chat`).
  accuracy      R_acc of the executor and planner stages: "judge" (an `LlmJudge` on that
                backend; the paper's), or "rule" (EM / F1 alone, no judge call).
  rule          "em" | "f1": the rule metric; with accuracy "judge" it scores what the judge
                could not (an unreadable reply, a failed call), counted as judge_fallbacks.
  skill_quality the distiller stage's quality term: "judge" (`SkillJudge`; the paper's) or
                "rule" (the authors' rule-based score).
  skill_terms   its format and evolution-rationality terms: "judge" (a `SkillJudge` per term,
                the paper's J_skill) or "rule" (the authors' rules; the demos').
  max_tokens    the judges' reply cap.
TTRL's no-ground-truth panel and alignment judge use the same backend (`judge_panel`,
pipeline.judges).
Missing keys take the paper's defaults: accuracy "judge", rule "em", skill_quality "judge",
skill_terms "judge".
"""

from __future__ import annotations

from typing import Any

from apex_jax.judges import AlignConfig, AlignJudge, ChatClient, NoGtConfig, NoGtJudge
from apex_jax.judges import InProcessChat
from apex_jax.judges import LlmJudge, LlmJudgeConfig
from apex_jax.judges import SkillJudge, SkillJudgeConfig
from apex_jax.training.accuracy import RULES, JudgedAccuracy, RuleAccuracy
from apex_jax.training.ttrl import JudgeBackends
from morse_jax import llm

KINDS = ("inprocess", "http")
CHOICES = ("judge", "rule")


def _choice(c, name: str, default: str, allowed) -> str:
  value = c.get(name, default)
  if value not in allowed:
    raise ValueError(f"config.judges.{name} {value!r} not in {allowed}")
  return value


def judge_chat(exp) -> Any:
  """The experiment's judge chat backend, made once and kept on `exp` (a separate in-process
  judge model is loaded once for every judge)."""
  chat = getattr(exp, "_judge_chat", None)
  if chat is not None:
    return chat
  c = exp.config.judges
  if _choice(c, "kind", "inprocess", KINDS) == "inprocess":
    model = exp.model  # judges.path: a separate judge model (the paper's); else the backbone
    if c.get("path"):
      model = llm.load(c.path, dtype=c.get("dtype") or exp.config.model.dtype)
    chat = InProcessChat(model, seed=exp.config.seed)
  else:
    chat = ChatClient(c.url, c.model)
  exp._judge_chat = chat
  return chat


def accuracy_choice(c) -> tuple[str, str]:
  """(accuracy, rule) of config.judges, checked, with the paper's defaults ("judge", "em")."""
  return _choice(c, "accuracy", "judge", CHOICES), _choice(c, "rule", "em", RULES)


def reward_accuracy(exp):
  """R_acc's scorer for the executor and planner stages (see the module docstring)."""
  c = exp.config.judges
  accuracy, rule = accuracy_choice(c)
  if accuracy == "rule":
    return RuleAccuracy(rule)
  return JudgedAccuracy(LlmJudge(judge_chat(exp), LlmJudgeConfig(max_tokens=c.max_tokens)),
                        fallback=rule)


def skill_judge(exp):
  """The distiller stage's quality judge, or None for the rule-based quality."""
  c = exp.config.judges
  if _choice(c, "skill_quality", "judge", CHOICES) == "rule":
    return None
  return SkillJudge(judge_chat(exp), SkillJudgeConfig(max_tokens=c.max_tokens))


def skill_term_judges(exp) -> dict:
  """The distiller stage's judges of its format and evolution terms ({}: the rules)."""
  c = exp.config.judges
  if _choice(c, "skill_terms", "judge", CHOICES) == "rule":
    return {}
  return {term: SkillJudge(judge_chat(exp), SkillJudgeConfig(max_tokens=c.max_tokens, term=term))
          for term in ("format", "evolution")}


def judge_panel(chat, max_tokens: int):
  """The no-GT panel and the alignment judge on one chat backend, replies capped at
  `max_tokens` (alignment: at most 16, the authors' cap)."""
  nogt = NoGtJudge(chat, NoGtConfig(evaluator_max_tokens=max_tokens,
                                    arbiter_max_tokens=max_tokens))
  return JudgeBackends(nogt, AlignJudge(chat, AlignConfig(max_tokens=min(max_tokens, 16))))
