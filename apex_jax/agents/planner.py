"""The Planner: plan, evaluate (replan or not), replan; and the episode loop over a batch.

One question's planner turns are ONE conversation, as in the authors' agent loop
(Planner-Train/mem-plan/verl/experimental/agent_loop/multi_turn_loop.py): [system, plan prompt]
-> plan; [judge prompt with the executor's trace] -> "yes" / "no"; if yes, [replan prompt] ->
revised plan. The executor then continues its run with the revised plan. Every planner turn of a
round is generated in one sampler call.

The episode returns per question y1 (the first run's answer), y2 (the final one: y1 when no
replan, as the authors' reward has it), the decision and every trajectory, for the planner reward
0.7 acc(y2) + 0.2 acc(y1) + 0.05 format + 0.05 decision (Planner-Train/.../mmsearch.py
`compute_score`: format = the decision reads exactly "yes" or "no" after the think block, and
every planner turn has balanced think tags).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Sequence

import jax

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.conversation import ChatDeltas, Conversation
from apex_jax.agents.trajectory import Trajectory
from apex_jax.memory import skills as skills_lib
from apex_jax.memory.records import PlannerContext


@dataclasses.dataclass(frozen=True)
class Decision:
  replan: bool
  parsed: bool  # False: neither a JSON field nor a yes/no word; replan defaults to False
  exact: bool  # the text after the think block is exactly "yes" or "no" (the format reward)
  text: str  # the text after the think block


_DECISION_KEYS = ("replan", "decision", "answer")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_decision(text: str) -> Decision:
  """The evaluate turn -> Decision. A JSON object with a field replan / decision / answer (bool or
  yes/no) wins; else the first standalone yes or no word; else unparsed, no replan."""
  body = prompts.after_think(text)
  exact = body.lower() in ("yes", "no")
  try:
    obj = skills_lib.extract_json_object(body)
  except skills_lib.DistillerError:
    obj = {}
  for key in _DECISION_KEYS:
    value = obj.get(key)
    if isinstance(value, bool):
      return Decision(value, True, exact, body)
    if isinstance(value, str) and value.strip().lower() in ("yes", "no"):
      return Decision(value.strip().lower() == "yes", True, exact, body)
  word = _YES_NO.search(body)
  if word:
    return Decision(word.group(1).lower() == "yes", True, exact, body)
  return Decision(False, False, exact, body)


def think_balanced(text: str) -> bool:
  return text.count("<think>") == text.count("</think>")


def context_slots(ctx: PlannerContext | None) -> tuple[str, str]:
  """(skill text, memory text) for PLAN_PROMPT from MemoryBank.planner_context, whose text is the
  rendered skill (when shown) followed by the rendered memories."""
  if ctx is None:
    return prompts.NO_SKILL, skills_lib.render_memories([], []).strip()
  if ctx.skill is None:
    return prompts.NO_SKILL, ctx.text
  skill = skills_lib.render_skill(ctx.skill, ctx.gamma).strip()
  if not ctx.text.startswith(skill):
    return prompts.NO_SKILL, ctx.text  # a layout this code does not know: show it all as context
  return skill, ctx.text[len(skill):].strip()


@dataclasses.dataclass
class PlannerRun:
  """One question's planner conversation and counters."""

  question: str
  conv: Conversation
  stats: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  plan: str = ""
  decision: Decision | None = None
  replan: str | None = None
  think_ok: bool = True

  def trajectory(self, answer: str | None) -> Trajectory:
    stats = {k: float(v) for k, v in self.stats.items()}
    for key in ("llm_calls", "plan_over_limit", "decision_unparsed", "truncated"):
      stats.setdefault(key, 0.0)
    return Trajectory("planner", self.conv.segments, self.conv.generated_text(), answer, stats,
                      info={"question": self.question, "messages": self.conv.messages,
                            "plan": self.plan, "replan": self.replan,
                            "decision": None if self.decision is None else self.decision.text})


class Planner:
  def __init__(self, generator, config: AgentConfig = AgentConfig()):
    self.generator, self.config = generator, config
    self.tokenizer = generator.tokenizer_of("planner")
    self.deltas = ChatDeltas(self.tokenizer)

  def _generate(self, runs: Sequence[PlannerRun], rng) -> list[str]:
    if not runs:
      return []
    gens = self.generator.generate("planner", [r.conv.tokens() for r in runs], rng=rng,
                                   max_new_tokens=self.config.planner_max_new_tokens,
                                   sampling=self.config.sampling)
    if len(gens) != len(runs):
      raise RuntimeError(f"generator returned {len(gens)} generations for {len(runs)} prompts")
    for r, gen in zip(runs, gens):
      r.conv.add_generated(gen)
      r.stats["llm_calls"] += 1
      r.stats["truncated"] += int(not gen.finished)
      if not think_balanced(gen.text):
        r.think_ok = False
        r.stats["think_unbalanced"] += 1
    return [g.text for g in gens]

  def _limited(self, r: PlannerRun, text: str, limit: int, name: str) -> str:
    """The plan after its think block, measured in words; cut to `limit` when enforced."""
    body = prompts.after_think(text)
    words = body.split()
    r.stats[f"{name}_words"] = len(words)
    if not words:
      r.stats[f"empty_{name}"] += 1
    if len(words) > limit:
      r.stats[f"{name}_over_limit"] += 1
      if self.config.enforce_word_limit:
        body = " ".join(words[:limit])
    return body

  def plan(self, questions: Sequence[str], contexts: Sequence[PlannerContext | None], *,
           rng: jax.Array, captions: Sequence[str | None] | None = None,
           openings: Sequence[list[dict]] | None = None) -> list[PlannerRun]:
    """Starts each question's conversation and generates its plan (one sampler call).
    captions: each question's image caption (None: none), shown after the question; the
    planner never sees the image itself. openings: each question's opening chat instead of the
    plan prompt of its context (a baseline's planner prompt, apex_jax.baselines)."""
    captions = [None] * len(questions) if captions is None else list(captions)
    if len(contexts) != len(questions) or len(captions) != len(questions):
      raise ValueError(f"Planner.plan: {len(contexts)} contexts and {len(captions)} captions "
                       f"for {len(questions)} questions")
    if openings is None:
      openings = [prompts.plan_messages(*context_slots(ctx), q, self.config.plan_word_limit,
                                        self.config.prompt_style, caption)
                  for q, ctx, caption in zip(questions, contexts, captions)]
    if len(openings) != len(questions):
      raise ValueError(f"Planner.plan: {len(openings)} openings for {len(questions)} questions")
    runs = [PlannerRun(q, Conversation.start(self.tokenizer, list(m)))
            for q, m in zip(questions, openings)]
    for r, text in zip(runs, self._generate(runs, rng)):
      r.plan = self._limited(r, text, self.config.plan_word_limit, "plan")
    return runs

  def evaluate(self, runs: Sequence[PlannerRun], executions: Sequence[Trajectory], *,
               rng: jax.Array) -> list[Decision]:
    """Shows each run the executor's trace and asks yes (replan) / no."""
    if len(executions) != len(runs):
      raise ValueError(f"Planner.evaluate: {len(executions)} executions for {len(runs)} runs")
    for r, ex in zip(runs, executions):
      r.conv.add_messages(self.deltas, [prompts.judge_message(r.question, ex.info["turns"],
                                                              self.config.prompt_style)])
    for r, text in zip(runs, self._generate(runs, rng)):
      r.decision = parse_decision(text)
      r.stats["decision_unparsed"] += int(not r.decision.parsed)
      r.stats["decision_inexact"] += int(not r.decision.exact)
      r.stats["replan"] = int(r.decision.replan)
    return [r.decision for r in runs]

  def replan(self, runs: Sequence[PlannerRun], memories: Sequence[str | None], *,
             rng: jax.Array) -> list[str]:
    """The revised plans; memories: rendered new memories per run (None: none shown)."""
    if len(memories) != len(runs):
      raise ValueError(f"Planner.replan: {len(memories)} memory texts for {len(runs)} runs")
    for r, mem in zip(runs, memories):
      r.conv.add_messages(self.deltas, [prompts.replan_message(
          r.question, mem, self.config.replan_word_limit, self.config.prompt_style)])
    for r, text in zip(runs, self._generate(runs, rng)):
      r.replan = self._limited(r, text, self.config.replan_word_limit, "replan")
    return [r.replan for r in runs]

  def format_ok(self, run: PlannerRun) -> bool:
    """The authors' format score: balanced think tags in every turn, decision exactly yes/no."""
    return run.think_ok and run.decision is not None and run.decision.exact
