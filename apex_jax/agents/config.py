"""AgentConfig: the limits and sampling settings of the three APEx agents (typed, frozen, checked).

Defaults follow the authors' code (J-Ding519/APEx): plans of at most 400 words and replans of at
most 200 (Planner-Train/mem-plan/local_search/prompt.py), at most 20 LLM calls per executor run
(Serve/Train_Planner/call_agent.py MAX_LLM_CALL_PER_RUN), 3 passages per query
(Executor-Train/Train/verl/tools/search_tool.py topk), a run that ends at the first turn without
a valid tool call (call_agent.py `run_multimodal_dialogue`); max_turns 10 is the paper's.
"""

from __future__ import annotations

import dataclasses

from morse_jax import llm

from apex_jax.agents import engines as engines_lib
from apex_jax.agents.prompts import STYLES as PROMPT_STYLES, PromptStyle
ON_FORMAT_ERROR = ("end", "feedback")
SUMMARIES = ("distiller", "rule")


class AgentConfigError(ValueError):
  """An agent setting is invalid; the message names the field and the value."""


def _positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise AgentConfigError(f"AgentConfig.{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  max_turns: int = 10  # executor assistant turns per run
  max_llm_calls: int = 20  # executor generations per question over the episode (run + rerun)
  max_tool_tokens: int = 512  # a tool response is cut to this many tokens
  max_context_tokens: int = 16384  # a conversation that would grow past this ends (truncated)
  plan_word_limit: int = 400
  replan_word_limit: int = 200
  enforce_word_limit: bool = True  # cut an over-long plan before the executor sees it
  topk: int = 3  # passages per search query
  max_queries: int | None = None  # queries per tool call (None: any number)
  planner_max_new_tokens: int = 1024
  executor_max_new_tokens: int = 1024
  distiller_max_new_tokens: int = 2048
  temperature: float = 1.0  # 0 is greedy
  top_p: float = 1.0
  on_format_error: str = "end"  # "end" (the authors') or "feedback": show the error, go on
  replan_memories: bool = True  # the paper's replan sees k=1 new memories; the code shows none
  prompts: str = "authors"  # "authors": verbatim; "compact": same protocol, a few dozen words
  # who writes a memory's workflow summary: "distiller" (the paper's: the Distiller, one call a
  # run) or "rule" (prompts.rule_workflow: the run's searches and answer, for a backbone too
  # small to copy names; ARCHITECTURE's deviations table)
  summaries: str = "distiller"
  # issue 55: the agents' calls on one generation engine per backbone (apex_jax.agents.engines;
  # an episode's next turn goes in as soon as its tool call returns), `engine_slots` rows decoded
  # together; False: the static sampler, the executor's turns in lockstep. Same trajectories.
  engine: bool = False
  engine_slots: int = 16
  # the engine keeps finished calls' KV pages (llm/prefix_cache.py): an executor turn prefills
  # only what its last turn did not (its reply and the tool's result), a group's samples their
  # prompt once
  engine_prefix_cache: bool = True

  def __post_init__(self):
    for name in ("max_turns", "max_llm_calls", "max_tool_tokens", "max_context_tokens",
                 "plan_word_limit", "replan_word_limit", "topk", "planner_max_new_tokens",
                 "executor_max_new_tokens", "distiller_max_new_tokens", "engine_slots"):
      _positive_int(name, getattr(self, name))
    if self.max_queries is not None:
      _positive_int("max_queries", self.max_queries)
    if self.max_llm_calls < self.max_turns:
      raise AgentConfigError(f"AgentConfig.max_llm_calls ({self.max_llm_calls!r}) must be >= "
                             f"max_turns ({self.max_turns!r})")
    if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
        or self.temperature < 0:
      raise AgentConfigError(f"AgentConfig.temperature must be a number >= 0, got "
                             f"{self.temperature!r}")
    if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
      raise AgentConfigError(f"AgentConfig.top_p must be in (0, 1], got {self.top_p!r}")
    if self.on_format_error not in ON_FORMAT_ERROR:
      raise AgentConfigError(f"AgentConfig.on_format_error {self.on_format_error!r} not in "
                             f"{ON_FORMAT_ERROR}")
    if self.prompts not in PROMPT_STYLES:
      raise AgentConfigError(f"AgentConfig.prompts {self.prompts!r} not in "
                             f"{tuple(PROMPT_STYLES)}")
    if self.summaries not in SUMMARIES:
      raise AgentConfigError(f"AgentConfig.summaries {self.summaries!r} not in {SUMMARIES}")
    for name in ("enforce_word_limit", "replan_memories", "engine", "engine_prefix_cache"):
      if not isinstance(getattr(self, name), bool):
        raise AgentConfigError(f"AgentConfig.{name} must be a bool, got "
                               f"{getattr(self, name)!r}")

  @property
  def sampling(self) -> llm.SamplingConfig:
    return llm.SamplingConfig(temperature=float(self.temperature), top_p=float(self.top_p))

  @property
  def prompt_style(self) -> PromptStyle:
    """The style `prompts` names: every prompt the three agents build (checked above)."""
    return PROMPT_STYLES[self.prompts]

  def engines(self):
    """The generators' engines these settings ask for (None: the static sampler); rows hold a
    whole executor context."""
    if not self.engine:
      return None
    return engines_lib.AgentEngines(self.engine_slots, self.max_context_tokens,
                                    prefix_cache=self.engine_prefix_cache)

  def max_new_tokens(self, module: str) -> int:
    return getattr(self, f"{module}_max_new_tokens")
