"""The Distiller: skill synthesis / evolution replies for MemoryBank.apply_distiller_reply, and the
workflow summaries stored as instance memories. Every call batches all its prompts into one
sampler call.

Prompts (apex_jax.agents.prompts: `skill_messages`, `summary_messages`, in the configured style)
are the authors' Writer (J-Ding519/APEx Writer-Train/Train/writer_skill/prompt.py: system prompt,
SKILL_OUTPUT_SCHEMA, SKILL_SYNTHESIS_PROMPT when the bucket has no skill, else
SKILL_EVOLUTION_PROMPT with the current skill as JSON) and Memory-Serve/memory_serve.py
(`get_trace_prompt` for the workflow summary; an empty summary falls back to the raw trace, the
authors' other `llm_get_trace`). Memories are listed by `apex_jax.memory.format_batch`, labelled
with the bank's ids, which is what the bank accepts in absorbed_ids. An absorbed id that is not
one of the batch's is dropped and the rest of the reply still applied (the authors' code never
reads absorbed_ids; see apex_jax/memory/skills.py); each reply's trajectory stats say how many
were dropped (`unknown_absorbed_ids`), and the bank keeps the total. A skill whose category or
modality names another bucket is stored under the bucket asked about, as the authors'
skill_repository.py does (`bucket_overwrites` in the stats and the bank).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.conversation import Conversation
from apex_jax.agents.trajectory import Trajectory
from apex_jax.memory import DistillerResult, NewMemory
from apex_jax.memory.records import Memory, Skill
from apex_jax.memory.schema import Bucket, as_bucket


@dataclasses.dataclass
class Evolution:
  bucket: Bucket
  batch: list[Memory]  # the memories shown
  previous: Skill | None  # the skill before
  result: DistillerResult  # applied or not, operation, error kind
  trajectory: Trajectory


@dataclasses.dataclass
class Summary:
  text: str  # what is stored as the workflow summary
  fallback: bool  # True: the reply was empty, the raw trace is stored instead
  trajectory: Trajectory | None  # None: written by rule (AgentConfig.summaries "rule")


class Distiller:
  def __init__(self, generator, config: AgentConfig = AgentConfig()):
    self.generator, self.config = generator, config
    self.tokenizer = generator.tokenizer_of("distiller")

  def _generate(self, chats: Sequence[list[dict]], rng) -> list[tuple[Conversation, object]]:
    if not chats:
      return []
    convs = [Conversation.start(self.tokenizer, chat) for chat in chats]
    gens = self.generator.generate("distiller", [c.tokens() for c in convs], rng=rng,
                                   max_new_tokens=self.config.distiller_max_new_tokens,
                                   sampling=self.config.sampling)
    if len(gens) != len(convs):
      raise RuntimeError(f"generator returned {len(gens)} generations for {len(convs)} prompts")
    for conv, gen in zip(convs, gens):
      conv.add_generated(gen)
    return list(zip(convs, gens))

  def evolve(self, bank, buckets: Sequence, *, rng: jax.Array,
             force: bool = False) -> list[Evolution]:
    """One reply per bucket that is due for evolution (every given bucket when force), applied
    to the bank; a bad reply changes nothing and is counted in bank.distiller_errors. absorbed
    ids outside the batch are dropped from an applied reply, counted in
    bank.unknown_absorbed_ids and in the trajectory's stats; a skill category / modality naming
    another bucket is overwritten with the asked bucket's, counted in bank.bucket_overwrites and
    in the trajectory's stats."""
    pending = []
    for b in dict.fromkeys(as_bucket(x) for x in buckets):
      if force or bank.due_for_evolution(b):
        batch = bank.evolution_batch(b)
        if batch:  # nothing to distil in an empty bucket
          pending.append((b, batch, bank.get_skill(b)))
    chats = [prompts.skill_messages(b, batch, prev, self.config.prompt_style)
             for b, batch, prev in pending]
    out = []
    for (b, batch, prev), (conv, gen) in zip(pending, self._generate(chats, rng)):
      result = bank.apply_distiller_reply(b, gen.text, batch=batch)
      stats = {"llm_calls": 1.0, "truncated": float(not gen.finished),
               "applied": float(result.applied), "format_errors": float(not result.applied),
               "unknown_absorbed_ids": float(result.unknown_absorbed_ids),
               "bucket_overwrites": float(result.bucket_overwrites)}
      if result.error is not None:
        stats[f"error_{result.error.kind}"] = 1.0
      traj = Trajectory("distiller", conv.segments, gen.text, gen.text, stats,
                        info={"bucket": tuple(b), "operation": result.operation,
                              "error": None if result.error is None else str(result.error)})
      out.append(Evolution(b, list(batch), prev, result, traj))
    return out

  def summarize(self, traces: Sequence[str], *, rng: jax.Array) -> list[Summary]:
    """Workflow summaries of execution traces (prompts.render_trace), one sampler call; under
    `config.summaries == "rule"` written by prompts.rule_workflow, no call (trajectory None)."""
    if self.config.summaries == "rule":
      texts = [prompts.rule_workflow(prompts.trace_turns(t)) for t in traces]
      return [Summary(text or trace, not text, None) for trace, text in zip(traces, texts)]
    out = []
    for trace, (conv, gen) in zip(traces, self._generate(
        [prompts.summary_messages(t, self.config.prompt_style) for t in traces], rng)):
      text = prompts.after_think(gen.text)
      words = len(text.split())
      fallback = not text
      stats = {"llm_calls": 1.0, "truncated": float(not gen.finished), "summary_words": words,
               "over_limit": float(words > prompts.SUMMARY_WORDS), "empty_summary": float(fallback)}
      out.append(Summary(trace if fallback else text, fallback,
                         Trajectory("distiller", conv.segments, gen.text, text or None, stats,
                                    info={"trace": trace})))
    return out

  def workflow_memories(self, episodes, correct: Sequence[bool], *,
                        rng: jax.Array) -> tuple[list[Summary], list[NewMemory]]:
    """Summarises each episode's execution (both runs); returns (summaries, the memories that
    store each summary with its outcome in the episode's bucket)."""
    if len(correct) != len(episodes):
      raise ValueError(f"Distiller.workflow_memories: {len(correct)} outcomes for "
                       f"{len(episodes)} episodes")
    traces = [prompts.render_trace(e.question, [t for ex in e.executor for t in ex.info["turns"]])
              for e in episodes]
    summaries = self.summarize(traces, rng=rng)
    items = [NewMemory(e.question, s.text, bool(ok),
                       category=None if e.bucket is None else e.bucket.category,
                       modality=None if e.bucket is None else e.bucket.modality,
                       caption=e.caption)
             for e, s, ok in zip(episodes, summaries, correct)]
    return summaries, items

  def remember(self, bank, episodes, correct: Sequence[bool], *, rng: jax.Array):
    """`workflow_memories` stored; returns (summaries, MemoryBank.add_many results)."""
    summaries, items = self.workflow_memories(episodes, correct, rng=rng)
    return summaries, bank.add_many(items)
