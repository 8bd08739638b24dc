"""What the APEx demo's system does on each held-out question, with and without the memories of
a bank: the planner context it was shown, its plan, the executor's turns and the answer.

  python -m benchmarks.apex_demo_trace --bank=<workdir>/seed_0/banks/before_ttrl.db \
      [--config=configs/apex/demo_procedures.py] [--config.model.path=assets/toy_apex] [--questions=12]
  python -m benchmarks.apex_demo_trace --config.agents.summaries=rule   # no --bank: built here

The experts are the untrained ones (the base toy: the demo's `untrained` row), greedy; the bank
file is copied first, so it is read only. Without --bank, the config's memory building
(`pipeline.memory_build`, the untrained system on its training questions, then the
Distiller's evolution) builds one first and prints its memories and skills, so a change to
memory building is measured in one command. Why it exists: the ablation table says whether the
rows differ, this says why (RESULTS, "The procedure demo").
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import tempfile

from absl import app, flags
from ml_collections import config_flags

_BANK = flags.DEFINE_string("bank", None, "A memory bank file (sqlite) of a demo run (default: "
                            "build one by the config's memory building).")
_CONFIG = config_flags.DEFINE_config_file("config", "configs/apex/demo_procedures.py",
                                          "The demo's config (--config.<field>=... overrides).")
_QUESTIONS = flags.DEFINE_integer("questions", 0, "Held-out questions (0: the config's eval).")


def _flat(text: str, limit: int) -> str:
  return re.sub(r"\s+", " ", text)[:limit]


def copied_word(context: str, plan: str) -> bool | None:
  """Whether the plan's record word is one a positive memory of its context shows (None: the
  plan names no record word). The planner must copy it; a toy that garbles it (`girnal` for
  `girnos`) turns a right memory into a wrong search (RESULTS, "The procedure demo on three
  worlds")."""
  from apex_jax.toy.corpus import RECORD_WORD, positive_memories
  words = RECORD_WORD.findall(plan)
  if not words:
    return None
  return words[-1] in RECORD_WORD.findall(positive_memories(context))


def trace(c, bank_file: str, questions: int = 0, model=None) -> dict:
  """{use_memories: right answers} after printing every episode. model: already loaded (else
  the config's)."""
  import jax

  from apex_jax import experiment
  from apex_jax.agents.episode import run_episode
  from apex_jax.agents.executor import Executor
  from apex_jax.agents.planner import Planner
  from apex_jax.judges import rule

  work = tempfile.mkdtemp(prefix="apex_trace_")
  c.workdir, c.memory.path = work, os.path.join(work, "bank.db")
  shutil.copy(bank_file, c.memory.path)
  exp = experiment.build(c, model=model)
  agents = dataclasses.replace(exp.agents, temperature=0.0)
  examples = exp.test[:questions or c.eval.questions]
  right = {}
  for use_memories in (True, False):
    episodes = run_episode(Planner(exp.generator, agents),
                           Executor(exp.generator, exp.searcher, agents),
                           [ex.question for ex in examples], rng=jax.random.PRNGKey(c.seed),
                           bank=exp.bank, categories=[ex.category for ex in examples],
                           use_memories=use_memories, use_skills=True)
    right[use_memories], copies = 0, collections.Counter()
    for ep, ex in zip(episodes, examples):
      ok = rule.exact_match(ep.y2 or "", ex.answers) == 1.0  # the ablation table's EM
      right[use_memories] += ok
      print(f"=== memories={use_memories} right={ok} [{ex.category}] {ex.question} "
            f"gold {list(ex.answers)} answer {ep.y2!r}")
      print("  gold searches:", [h.query for h in ex.chain])
      if use_memories and ep.context is not None:
        print("  context:", _flat(ep.context.text, 900))
        copies[copied_word(ep.context.text, ep.plan)] += 1
      print("  plan:", ep.plan.replace("\n", " | "))
      for run in ep.executor:
        print("  executor:", _flat(run.text, 600))
    print(f"right with memories={use_memories}: {right[use_memories]} of {len(examples)}")
    if use_memories:
      print(f"plans naming a record word: {copies[True] + copies[False]}, of them a word a "
            f"positive memory shows: {copies[True]}")
  shutil.rmtree(work, ignore_errors=True)
  return right


def build_bank(c, bank_file: str, model=None):
  """The config's memory building on a new bank saved to `bank_file`; returns (its stats, the
  model it loaded, for `trace`) after printing every memory (outcome, summary) and skill."""
  import jax

  from apex_jax import experiment, pipeline

  work = tempfile.mkdtemp(prefix="apex_build_")
  c.workdir, c.memory.path = work, os.path.join(work, "bank.db")
  exp = experiment.build(c, model=model)
  stats = pipeline.memory_build(exp, rng=jax.random.PRNGKey(c.seed))
  for bucket in pipeline.memory_buckets(exp.bank):
    for m in exp.bank.memories(bucket):
      print(f"memory [{bucket[0]}] {m.outcome}: {_flat(m.workflow_summary, 300)}")
    skill = exp.bank.get_skill(bucket)
    print(f"skill [{bucket[0]}]:", "none" if skill is None else
          " | ".join(step.action for step in skill.procedure))
  print("memory building:", {k: v for k, v in stats.items() if v})
  exp.bank.backup(bank_file)
  shutil.rmtree(work, ignore_errors=True)
  return stats, exp.model


def main(argv):
  del argv
  c, bank, model = _CONFIG.value, _BANK.value, None
  if bank is None:
    bank = os.path.join(tempfile.mkdtemp(prefix="apex_bank_"), "built.db")
    _, model = build_bank(c, bank)
  trace(c, bank, _QUESTIONS.value, model=model)


if __name__ == "__main__":
  app.run(main)
