"""The comparison systems' drills (`apex_jax.toy.mia_forms`): each is the chat the system sends at
run time (`apex_jax.baselines`), each ExpeL reply is one the RuleBook applies, and what a reply
takes from its context follows APEx's drills' rule (a correct memory's record word, never a failed
one's)."""

import collections
import dataclasses
import json
import re

import pytest

from apex_jax.agents import baseline_prompts as mia
from apex_jax.baselines.expel import parse_rule_op
from apex_jax.datasets.world import World
from apex_jax.toy import build, corpus, mia_forms
from apex_jax.tools import ToolCall, parse_turn
from tests.apex.toy.conftest import COMPACT

MIA = corpus.CorpusConfig(mia_share=0.6)


@pytest.fixture(scope="module")
def pworld():
  return World.generate(7, 60, 120, procedures=True)


@pytest.fixture(scope="module")
def drilled(pworld):
  return build.world_turns(pworld, COMPACT, MIA, seed=7)


def _forms(turns, form):
  return [t for t in turns if t.get("form") == form]


def test_every_form_drilled_and_counted(drilled):
  turns, stats = drilled
  counts = collections.Counter(t.get("form") for t in turns)
  assert counts["memento"] == counts["expel_rule"] == stats["mia_memento"] > 20
  assert counts["expel_execute"] == stats["mia_rule_execute"] > 20
  assert stats["mia_expel_add"] > 0 and stats["mia_expel_agree"] > 0


def test_no_drills_without_share(pworld):
  turns, stats = build.world_turns(pworld, COMPACT, seed=7)
  assert not any("form" in t for t in turns)
  assert not any(k.startswith("mia_") for k in stats)


def test_memento_drill_is_mementos_chat_and_names_only_a_positive_cases_word(drilled):
  turns, _ = drilled
  named = 0
  for t in _forms(turns, "memento"):
    question = t["messages"][-1]["content"].rsplit("\n", 1)[1]
    cases = t["messages"][-1]["content"].split("Memories (judgement, question, plan):\n")[1]
    cases = cases.rsplit("\nWrite a numbered", 1)[0]
    assert t["messages"] == mia.memento_messages(question, cases, "compact")
    word = mia_forms.record_word_of(t["target"])
    assert word == (corpus.shown_record_word("", cases) if "record" in t["target"] else None)
    if word:
      assert word in corpus.positive_memories(cases)
      named += 1
  assert named > 0
  # then APEx's judge round (and a replan after a corrupted trace), as every plan conversation
  assert all(t["rounds"][0]["target"].endswith(("\nno", "\nyes")) for t in _forms(turns, "memento"))


def test_expel_replies_parse_as_the_rule_book_reads_them(drilled):
  turns, _ = drilled
  ops, empty = collections.Counter(), 0
  for t in _forms(turns, "expel_rule"):
    text = t["messages"][0]["content"]
    rules = text.split("Rules:\n", 1)[1].split("\nOne rule for this question", 1)[0]
    shown = len(re.findall(r"^\d+: ", rules, flags=re.M))
    op = parse_rule_op(t["target"], max(shown, 1))
    ops[op.operation] += 1
    if shown == 0:  # an empty bank (memory building's first batch): only ADD applies
      assert op.operation == "ADD"
      empty += 1
    assert op.operation == t["operation"]
    if op.operation == "ADD":
      failed = "Failure:\nQuestion:" in text
      assert op.rule_content.startswith(mia_forms.AVOID) == failed
  assert ops["ADD"] and ops["AGREE"]
  assert empty >= 0.2 * sum(ops.values())  # drilled often enough to be learnt (NO_RULES_SHARE)


@pytest.mark.parametrize("correct, word, shown, want", [
    (True, "vesk", ['1. search(" A vesk record")'], ("AGREE", 1)),
    (True, "vesk", ['Avoid: 1. search(" A vesk record")', '1. search(" B mora record")'],
     ("EDIT", 2)),
    (True, "vesk", [], ("ADD", 0)),
    (False, "mora", ['1. search(" A vesk record")'], ("ADD", 0)),
    (False, "mora", ['1. search(" A vesk record")', 'Avoid: 1. search(" B mora record")'],
     ("AGREE", 2)),
    (True, None, ['Avoid: x', 'y'], ("AGREE", 2)),
])
def test_rule_operation(correct, word, shown, want):
  op = mia_forms.rule_operation(correct, word, shown, "1. search(\" C vesk record\")")
  assert (op["operation"], op["rule_number"]) == want
  parse_rule_op(json.dumps(op), max(len(shown), 1))
  if op["operation"] == "ADD":
    assert op["rule_content"].startswith(mia_forms.AVOID) == (not correct)
  rules = list(shown)
  mia_forms.apply_operation(rules, list(range(len(shown))), op)
  assert len(rules) == len(shown) + (op["operation"] == "ADD")


def test_executor_follows_a_rules_word_and_guesses_under_an_avoid_rule(drilled, pworld):
  turns, _ = drilled
  followed = guessed = 0
  for t in _forms(turns, "expel_execute"):
    head, rule = t["messages"][0]["content"].split("\nRule:\n", 1)
    rule = rule.rstrip("\n")
    question = head.rsplit("Question: ", 1)[1] if "Question: " in head else None
    assert t["messages"] == mia.rule_messages(question, rule, "compact")
    searched = [q for r in [t["target"]] + [x["target"] for x in t["rounds"]]
                for turn in [parse_turn(r)] if isinstance(turn, ToolCall) for q in turn.queries]
    read = [mia_forms.record_word_of(f'search("{q}")') for q in searched]
    read = [w for w in read if w]
    word = mia_forms.rule_word(rule)
    if word and read:
      assert read == [word]
      followed += 1
    elif read:
      guessed += 1
  assert followed > 0 and guessed > 0


def test_config_checks_the_share():
  with pytest.raises(ValueError, match="mia_share"):
    corpus.CorpusConfig(mia_share=1.5)
  assert dataclasses.replace(MIA, mia_share=0.0).mia_share == 0.0
