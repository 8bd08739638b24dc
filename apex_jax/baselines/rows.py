"""The comparison systems' rows beside APEx's (config.eval.baselines; `apex_jax.pipeline.run`
adds them to results["eval"] after the ablation rows). Each runs on the initial experts (MIA
runs its baselines on the untrained model). A memory system (rag, expel, memento) first builds
its own bank from its own episodes on memory building's training questions, sampled as APEx's
memory building samples and judged by the same scorer (`judging.reward_accuracy`, a win only at
1.0): rag stores the raw trajectory, memento the first plan (as MIA's batch_memory_save),
expel lets the rule call edit its rules (`expel.RuleBook`). Then every system runs on the
held-out questions with the ablation rows' metrics (`row_scores`). The banks are rebuilt on
every run, under <workdir>/banks/baseline_<name>.db.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from apex_jax.agents import prompts as apex_prompts
from apex_jax.agents.generator import with_experts
from apex_jax.agents import baseline_prompts as prompts
from apex_jax.baselines.expel import OTHERS, RuleBook
from apex_jax.baselines.systems import MEMORY_SYSTEMS, Parts, Run, check_system, run_system
from apex_jax.experiment import Experiment, fresh_bank_path
from apex_jax.memory import MemoryBank, NewMemory
from apex_jax.row_scores import Outcome, bank_counts, batches, eval_examples, row_scores
from apex_jax.training import judging
from apex_jax.training.accuracy import AccuracyItem


def baseline_names(config) -> tuple[str, ...]:
  """config.eval.baselines (absent or empty: none), checked."""
  names = tuple(config.eval.get("baselines") or ())
  for name in names:
    check_system(name)
  return tuple(dict.fromkeys(names))


def baseline_bank(exp: Experiment, name: str, workdir: str) -> MemoryBank:
  """An empty bank <workdir>/banks/baseline_<name>.db on the experiment's embedder, ranking by
  question cosine alone (beta 1, alpha 1: MIA's question_weight 1, cosine_weight 1,
  win_rate_weight 0); k from memory.bank.k (MIA's /memory and /plan: 2 and 2)."""
  folder = os.path.join(workdir, "banks")
  os.makedirs(folder, exist_ok=True)
  config = dataclasses.replace(exp.bank.config, alpha=1.0, beta=1.0)
  return MemoryBank(fresh_bank_path(folder, f"baseline_{name}"), exp.bank.embedder,
                    config=config)


def stored_trace(question: str, run: Run, style: str) -> str:
  """The run's raw trajectory as MIA's batch_memory_save writes it (tool outputs cut)."""
  return apex_prompts.render_trace(question, run.turns, prompts.baseline_prompts(style).trace_words)


def build_memory(exp: Experiment, name: str, parts: Parts, *, rng: jax.Array) -> dict:
  """`name`'s episodes on memory_build.questions training questions, stored its way in
  parts.bank; the outcomes of the memories each episode was shown are recorded. Counts."""
  c = exp.config.memory_build
  scorer = judging.reward_accuracy(exp)
  rules = RuleBook(parts.generator, exp.evolving_agents(), parts.bank)
  stats = dict(episodes=0, correct=0, judge_calls=0, judge_fallbacks=0)
  for i, batch in enumerate(batches(exp.train[:c.questions], c.batch_size)):
    k_run, k_rule = jax.random.split(jax.random.fold_in(rng, i))
    questions = [ex.question for ex in batch]
    runs = run_system(name, parts, questions, rng=k_run)
    scores = scorer.score_many([AccuracyItem(ex.question, r.answer, tuple(ex.answers))
                                for r, ex in zip(runs, batch)])
    correct = [score >= 1.0 for score in scores]
    for key in ("judge_calls", "judge_fallbacks"):
      stats[key] += int(scorer.metrics.get(key, 0))
    for r, ok in zip(runs, correct):
      if r.shown_ids:
        parts.bank.record_outcome(r.shown_ids, ok)
    traces = [stored_trace(q, r, parts.agents.prompts) for q, r in zip(questions, runs)]
    if name == "expel":
      for key, n in rules.update(questions, traces, correct, rng=k_rule,
                                 data_ids=[ex.id for ex in batch]).items():
        stats[key] = stats.get(key, 0) + n
    else:
      parts.bank.add_many([NewMemory(q, t if name == "rag" else (r.plan or "N/A"), ok,
                                     category=OTHERS, data_id=ex.id)
                           for q, t, r, ok, ex in zip(questions, traces, runs, correct, batch)])
    stats["episodes"] += len(runs)
    stats["correct"] += sum(correct)
  return stats


def evaluate_system(exp: Experiment, name: str, parts: Parts, *, rng: jax.Array) -> dict:
  """`name` on the held-out questions, at eval.temperature, in batches of eval.batch_size: the
  ablation rows' EM / F1 / answered / context tokens; memory_context_tokens: the memory text
  (trajectories, rule or cases) its prompts carried."""
  examples = eval_examples(exp)
  parts = dataclasses.replace(parts, agents=dataclasses.replace(
      exp.agents, temperature=exp.config.eval.temperature))
  outcomes = []
  for i, batch in enumerate(batches(examples, exp.config.eval.batch_size)):
    for r in run_system(name, parts, [ex.question for ex in batch],
                        rng=jax.random.fold_in(rng, i)):
      tokenizer = parts.generator.tokenizer_of(r.memory_module)
      outcomes.append(Outcome(r.answer, sum(t.total_tokens() for t in r.conversations),
                              0 if r.memory_text is None else
                              len(tokenizer.encode(r.memory_text, add_special_tokens=False))))
  return row_scores(examples, outcomes)


def baseline_rows(exp: Experiment, names, *, rng: jax.Array, workdir: str) -> dict[str, dict]:
  """One row per system in `names`, all evaluated with the key `rng` (as the ablation rows);
  each names its bank and, for a memory system, its memory building's counts."""
  generator = with_experts(exp.generator, exp.experts)
  k_build = jax.random.split(rng)[0]
  out = {}
  for name in names:
    bank = baseline_bank(exp, name, workdir) if name in MEMORY_SYSTEMS else None
    try:
      parts = Parts(generator, exp.searcher, exp.memory_build_agents(), bank)
      built = None if bank is None else build_memory(exp, name, parts, rng=k_build)
      out[name] = evaluate_system(exp, name, parts, rng=rng)
      out[name]["bank"] = ({"path": "none", "memories": 0, "skills": 0} if bank is None else
                           {"path": bank.path, **bank_counts(bank)})
      if built is not None:
        out[name]["memory_build"] = built
    finally:
      if bank is not None:
        bank.close()
  return out
