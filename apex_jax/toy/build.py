"""The APEx SFT corpus of whole worlds: every question's executor conversation, a planner
conversation (on the gold trace or a corrupted one) and, per category, a few distiller replies.

  turns, stats = build.corpus(seeds=(0, 1), entities=120, questions=400,
                              config=AgentConfig(prompts="compact"))

Deterministic in (seeds, sizes, config, corpus config). With `procedures`, the worlds keep their
career and property facts in records (apex_jax.datasets.world_records): an executor run without a
plan naming the record word reads a record picked at random, and the memories store what the
run searched. With CorpusConfig.judge_share /
align_share the TTRL judges' conversations are added too (apex_jax.toy.judging), with
CorpusConfig.reading_hops the reading drills (apex_jax.toy.reading). Questions whose gold passage
a search misses are skipped and counted (`stats["gold_missed"]`): the tool would not show the
model what its gold run says it saw.
"""

from __future__ import annotations

import collections
import random
from typing import Sequence

from apex_jax.agents.config import AgentConfig
from apex_jax.datasets.world import World
from apex_jax.datasets.world_records import invented_words
from apex_jax.memory.records import Memory
from apex_jax.tools.overlap import WordSearch
from apex_jax.toy import corpus as C
from apex_jax.toy import judging, mia_forms, reading


def world_turns(world: World, config: AgentConfig, corpus_config: C.CorpusConfig = C.CorpusConfig(),
                seed: int = 0) -> tuple[list[dict], collections.Counter]:
  """(conversations, counters) of one world, question by question, then the distiller's."""
  rng = random.Random(seed)
  searcher = WordSearch(world.passages, config.topk)
  names = [e.name for e in world.entities.values()]
  stats, turns = collections.Counter(), []
  memories: dict[str, list[tuple[Memory, str | None]]] = collections.defaultdict(list)
  mia_state = (collections.defaultdict(list), collections.defaultdict(list))  # cases, rules
  owner = _owner(world)  # record passage id -> its entity's records
  for ex in world.examples:
    spaced = corpus_config.spaced_copies
    gold = C.executor_rounds(ex, searcher, config, spaced=spaced)
    if gold is None:
      stats["gold_missed"] += 1
      continue
    plan = C.numbered(C.plan_steps(ex)) if rng.random() < corpus_config.plan_share else None
    run, run_correct = gold, True  # the executor's run: what a memory of the episode stores
    if C.record_step(ex) is not None:
      plan, run, run_correct = _record_run(owner, ex, gold, plan is not None, searcher, config,
                                           corpus_config, rng, stats)
      if run is None:
        continue
    turns.append(C.executor_conversation(ex, run, plan, config))
    stats["execute"] += 1
    trace, searched, kind = gold, ex.hops, None
    if rng.random() < corpus_config.negative_share:
      kind = rng.choice(C.CORRUPTIONS)
      trace, searched = C.corrupt(ex, searcher, config, kind, rng, names, spaced)
      if trace is None:
        stats["corrupt_missed"] += 1
        continue
    remembered, pitfall = (trace, kind) if kind else (run, None if run_correct else "wrong_record")
    if rng.random() < corpus_config.summary_share:
      turns.append(C.summary_conversation(ex, remembered, config))
      stats["summary"] += 1
    earlier, context = [m for m, _ in memories[ex.category]], None
    if rng.random() < corpus_config.context_share:
      shown = _negatives(memories[ex.category], corpus_config)
      context = C.planner_context(ex.category, earlier, with_skill=rng.random() < 0.5,
                                  negatives=[m for m, _ in shown])
      stats["plan_decoy_negatives"] += any(p == "wrong_record" for _, p in shown)
    planned = C.planner_conversation(ex, trace, searched, kind is None, config, context)
    words = world.record_words.get(ex.category, ())
    if words and context is not None and rng.random() < corpus_config.fresh_record_words:
      planned = C.swap_words(planned, dict(zip(words, invented_words(rng, set(words), len(words)))))
      stats["plan_fresh_words"] += 1
    turns.append(planned)
    stats["plan_replan" if kind else "plan_accept"] += 1
    if corpus_config.judge_share and rng.random() < corpus_config.judge_share:
      judged = judging.nogt_conversations(ex, trace, kind, rng)
      turns += judged
      stats["judge_nogt"] += len(judged)
    if earlier and corpus_config.align_share and rng.random() < corpus_config.align_share:
      turns.append(judging.alignment_conversation(
          ex, C.skill_reply(ex.category, earlier, None, [])["skill"], rng))
      stats["judge_align"] += 1
    if corpus_config.mia_share:
      turns += _mia_drills(owner, ex, gold, plan, run, run_correct, (trace, searched, kind),
                           mia_state, searcher, config, corpus_config, rng, stats)
    flow = C.workflow(remembered)
    if C.record_step(ex) is not None and rng.random() < corpus_config.memory_noise:
      flow = C.noisy_workflow(flow, rng)
      stats["memory_noisy"] += 1
    memories[ex.category].append((Memory(sum(map(len, memories.values())) + 1, ex.category,
                                         C.MODALITY, ex.question, flow,
                                         "correct" if pitfall is None else "incorrect"), pitfall))
  size = corpus_config.distill_batch
  for category in sorted(memories):
    items = memories[category]
    chunks = [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
    chunks = chunks[:corpus_config.distill_batches]
    if not chunks:
      continue
    batches = [[m for m, _ in chunk] for chunk in chunks]
    pitfalls = [[C.PITFALLS[k] for _, k in chunk if k] for chunk in chunks]
    turns += C.distiller_conversations(category, batches, pitfalls, config)
    stats["distill"] += len(batches)
  if corpus_config.reading_hops:
    drills, missed = reading.drills(world.examples, searcher, config, rng,
                                    corpus_config.reading_hops, corpus_config.spaced_copies)
    turns += drills
    stats["reading"] += len(drills)
    stats["reading_missed"] += missed
  return turns, stats


def _mia_drills(owner: dict, ex, gold, plan, run, run_correct, judged, state, searcher,
                config: AgentConfig, corpus_config: C.CorpusConfig, rng: random.Random,
                stats) -> list[dict]:
  """The comparison systems' drills of one question (`mia_forms`), mia_share of the questions;
  every question's first plan goes into its category's Memento cases (as Memento stores
  episodes) and each drilled rule call's operation into its rule bank."""
  cases, rules = state[0][ex.category], state[1][ex.category]
  out = []
  if rng.random() < corpus_config.mia_share:
    trace, searched, kind = judged
    shown = [m for m in cases if m.correct][-2:] + [m for m in cases if not m.correct][-2:]
    out.append(mia_forms.memento_conversation(ex, trace, searched, kind is None, shown, config))
    out.append(mia_forms.expel_rule_conversation(ex, run, run_correct, rules, config, rng))
    stats["mia_memento"] += 1
    stats[f"mia_expel_{out[-1]['operation'].lower()}"] += 1
    if rules:
      rule = rng.choice(rules)
      drill = mia_forms.expel_execute_conversation(
          ex, rule, lambda word: _run_reading(owner, ex, gold, word, searcher, config,
                                              corpus_config, rng), config)
      if drill is None:
        stats["mia_rule_missed"] += 1
      else:
        out.append(drill)
        stats["mia_rule_execute"] += 1
  first_plan = plan or C.numbered(C.plan_steps(ex))
  cases.append(Memory(len(cases) + 1, ex.category, C.MODALITY, ex.question, first_plan,
                      "correct" if run_correct else "incorrect"))
  return out


def _run_reading(owner: dict, ex, gold, word, searcher, config: AgentConfig,
                 corpus_config: C.CorpusConfig, rng: random.Random):
  """The executor run of `ex` that reads `word`'s record (None: the unguided guess,
  `record_guess`); the gold run for a question without a record step; None when the entity
  has no such record or a search misses."""
  if C.record_step(ex) is None:
    return gold
  records = owner[ex.chain[C.record_step(ex)].passage_id]
  if word is None:
    word = _guess(records, corpus_config, rng)
  if word not in [r.word for r in records]:
    return None
  return _reading(ex, records, word, searcher, config, corpus_config)


def _guess(records, corpus_config: C.CorpusConfig, rng: random.Random) -> str:
  """The record an unguided executor reads: the listing's first or a random one
  (`record_guess`)."""
  words = [r.word for r in records]  # in the listing's order
  return words[0] if corpus_config.record_guess == "first" else rng.choice(words)


def _reading(ex, records, word: str, searcher, config: AgentConfig,
             corpus_config: C.CorpusConfig):
  """The executor run of `ex` reading `word`'s record (None when a search misses)."""
  return C.executor_rounds(C.reread(ex, records, word), searcher, config,
                           spaced=corpus_config.spaced_copies)


def _negatives(memories: Sequence[tuple[Memory, str | None]], corpus_config: C.CorpusConfig,
               ) -> list[tuple[Memory, str | None]]:
  """The incorrect (memory, pitfall)s a plan prompt shows: the last `context_negatives`, with
  `decoy_negatives` the wrong-record runs first."""
  bad = [(m, p) for m, p in memories if not m.correct]
  if corpus_config.decoy_negatives:  # a stable sort: the order of each kind is kept
    bad.sort(key=lambda x: x[1] == "wrong_record")
  return bad[len(bad) - corpus_config.context_negatives:]


def _record_run(owner: dict, ex, gold_run, planned: bool, searcher, config: AgentConfig,
                corpus_config: C.CorpusConfig, rng: random.Random, stats):
  """(plan, executor run, correct) of a procedure question: with a plan naming the record word
  (word_plan_share of the plans) the gold run; else (the generic plan, or none) a run reading a
  record of the entity's listing (a random one, or the first: `record_guess`). The run is None when its search misses."""
  gold = ex.chain[C.record_step(ex)]
  records = owner[gold.passage_id]
  if planned and rng.random() < corpus_config.word_plan_share:
    word = gold.query[:-len(" record")].rsplit(" ", 1)[1]
    stats["record_word_plan"] += 1
    return C.numbered(C.plan_steps(ex, word)), gold_run, True
  plan = C.numbered(C.plan_steps(ex)) if planned else None
  guess = _guess(records, corpus_config, rng)
  run = _reading(ex, records, guess, searcher, config, corpus_config)
  correct = guess == gold.passage_id.rsplit("-", 1)[1]
  stats["record_guess_right" if correct else "record_guess_wrong"] += 1
  if run is None:
    stats["guess_missed"] += 1
  return plan, run, correct


def _owner(world: World) -> dict:
  """record passage id -> its entity's records."""
  return {r.passage_id: rs for rs in world.records.values() for r in rs}


def world_seeds(seed: int, worlds: int) -> tuple[list[int], list[int]]:
  """(training worlds, held-out world) of a toy run with this seed (launchers.pretrain_toy)."""
  return [seed * 1000 + i for i in range(worlds)], [100000 + seed]


def corpus(seeds: Sequence[int], entities: int, questions: int, config: AgentConfig,
           corpus_config: C.CorpusConfig = C.CorpusConfig(), procedures: bool = False,
           ) -> tuple[list[dict], collections.Counter]:
  """The turns of one world per seed (World.generate(seed, entities, questions, procedures)), in
  order."""
  turns, stats = [], collections.Counter()
  for seed in seeds:
    t, s = world_turns(World.generate(seed, entities, questions, procedures), config,
                       corpus_config, seed)
    turns += t
    stats.update(s)
  return turns, stats
