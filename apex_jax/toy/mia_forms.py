"""Drills for the comparison systems' prompt forms (`apex_jax.baselines`, ECNU-SII/MIA's), so that
the toy meets ExpeL's and Memento's prompts as it was taught APEx's: on the same worlds, from the
same gold runs, and with the same rule for what a reply may take from its context (a record word
a correct memory shows, never a failed one's).

- memento: Memento's meta-planner opening (`agents.baseline_prompts.memento_messages`) with cases
  (judgement, question, plan) of earlier questions of the category, as Memento stores them (the
  episode's first plan) -> the plan APEx's planner is taught for the same content (the record
  word a correct case's plan names, else the generic record step), then the same judge / replan
  rounds.
- expel_rule: ExpeL's rule call (`expel_messages`: the run's trace as the successful or the failed
  trial, up to 3 rules of the category's rule bank) -> one JSON operation (`expel.parse_rule_op`'s
  schema): a correct run AGREEs with a shown rule naming the record word it read, EDITs a shown
  rule naming another word into its workflow, else ADDs its workflow; a failed run AGREEs with a
  shown "Avoid:" rule naming its word, else ADDs "Avoid: <its workflow>". The operation is applied
  to the world's rule bank, which later prompts show.
- expel_execute: the executor's opening with a rule after the question (`rule_messages`) -> the
  run a plan with the same content gets: a rule naming a record word reads that word's record
  (right or wrong), an "Avoid:" rule or one without a word leaves the executor to its unguided
  guess.
"""

from __future__ import annotations

import json
import random
from typing import Callable, Sequence

from apex_jax.agents import baseline_prompts as mia
from apex_jax.agents import prompts as apex_prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.datasets.records import QAExample
from apex_jax.memory.records import Memory
from apex_jax.toy import corpus as C

AVOID = "Avoid: "  # a rule written from a failed trial
# rule calls shown no rule at all: memory building's first batch sees an empty bank (RuleBook
# shows the bank as it stood before the batch: the demo's first 6 of 24 questions); drilled only
# as each category's first question (5 %), run 13's first toy answered AGREE to "None"
NO_RULES_SHARE = 0.3


def record_word_of(text: str) -> str | None:
  """The record word a workflow or plan searches (`search(" X vesk record")`, `Search "X vesk
  record".`), or None."""
  found = C.RECORD_WORD.search(text)
  return found.group(1) if found else None


def rule_word(rule: str) -> str | None:
  """The record word a rule tells the executor to read: a correct run's rule's; None for an
  "Avoid:" rule (a failed guess) or a rule without one."""
  return None if rule.startswith(AVOID) else record_word_of(rule)


def memento_conversation(example: QAExample, trace, searched: int, correct: bool,
                         cases: Sequence[Memory], config: AgentConfig) -> dict:
  """Memento's plan from `cases` (Memory rows whose workflow_summary is the case's plan), then
  APEx's judge and replan rounds on `trace`."""
  good = [m for m in cases if m.correct]
  bad = [m for m in cases if not m.correct]
  text = mia.render_cases(good, bad)
  word = C.shown_record_word("", text) if C.record_step(example) is not None else None
  opening = mia.memento_messages(example.question, text, config.prompts)
  conv = C.planner_conversation(example, trace, searched, correct, config, opening=opening,
                                word=word)
  return {**conv, "form": "memento"}


def rule_operation(correct: bool, word: str | None, shown: Sequence[str],
                   workflow: str) -> dict:
  """The ExpeL reply for a trial (see the module's docstring), as a dict of the JSON schema."""
  for i, rule in enumerate(shown, 1):
    avoid = rule.startswith(AVOID)
    if avoid != (not correct):
      continue
    if record_word_of(rule) == word:
      return {"operation": "AGREE", "rule_number": i, "rule_content": ""}
  if correct:
    for i, rule in enumerate(shown, 1):
      if not rule.startswith(AVOID) and word is not None and record_word_of(rule) not in (None,
                                                                                        word):
        return {"operation": "EDIT", "rule_number": i, "rule_content": workflow}
    return {"operation": "ADD", "rule_number": 0, "rule_content": workflow}
  return {"operation": "ADD", "rule_number": 0, "rule_content": AVOID + workflow}


def apply_operation(rules: list[str], shown_at: Sequence[int], op: dict) -> None:
  """The operation on the category's rule list (shown_at: the list positions of the rules the
  prompt numbered 1, 2, ..)."""
  if op["operation"] == "EDIT":
    rules[shown_at[op["rule_number"] - 1]] = op["rule_content"]
  elif op["operation"] == "ADD":
    rules.append(op["rule_content"])


def expel_rule_conversation(example: QAExample, run, correct: bool, rules: list[str],
                            config: AgentConfig, rng: random.Random) -> dict:
  """ExpeL's rule call on this run with up to EXPEL_SIMILAR of the category's rules (a random
  pick, as cosine ranks a category's questions about alike; none in NO_RULES_SHARE of the
  calls), the reply applied to `rules`."""
  k = 0 if rng.random() < NO_RULES_SHARE else min(mia.EXPEL_SIMILAR, len(rules))
  shown_at = sorted(rng.sample(range(len(rules)), k))
  rng.shuffle(shown_at)
  shown = [rules[i] for i in shown_at]
  trace = apex_prompts.render_trace(example.question, run,
                                    mia.baseline_prompts(config.prompts).trace_words)
  word = record_word_of(C.workflow(run)) if C.record_step(example) is not None else None
  op = rule_operation(correct, word, shown, C.workflow(run))
  apply_operation(rules, shown_at, op)
  opening = mia.expel_messages(example.question, trace, correct, shown, config.prompts)
  return C.conversation("apex_distill", opening, [json.dumps(op, ensure_ascii=False)], [],
                        f"expel:{example.id}", form="expel_rule", operation=op["operation"])


def expel_execute_conversation(example: QAExample, rule: str,
                               run_for: Callable[[str | None], list[dict] | None],
                               config: AgentConfig) -> dict | None:
  """The executor with `rule` after its question; run_for(word) is the run that reads `word`'s
  record (None: the unguided guess); None when that run's search misses."""
  run = run_for(rule_word(rule) if C.record_step(example) is not None else None)
  if run is None:
    return None
  return C.executor_conversation(example, run, None, config,
                                 mia.rule_messages(example.question, rule, config.prompts),
                                 form="expel_execute")
