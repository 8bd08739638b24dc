"""The APEx SFT corpus parses back with the run-time parsers, is deterministic, and the compact
prompts keep the protocol in fewer tokens."""

import json

import pytest

from apex_jax.agents import prompts
from apex_jax.agents.planner import parse_decision, think_balanced
from apex_jax.memory import Memory, MemoryBank
from apex_jax.memory.schema import Bucket
from apex_jax.toy import build, corpus
from apex_jax.tools import Answer, ToolCall, parse_turn
from tests.apex.memory.fakes import HashEmbedder
from tests.apex.toy.conftest import COMPACT


def _replies(turn):
  return [turn["target"]] + [r["target"] for r in turn["rounds"]]


def _of(turns, role):
  return [t for t in turns if t["role"] == role]


def test_counts_and_roles(compact, world):
  turns, stats = compact
  assert stats["execute"] + stats["gold_missed"] == len(world.examples)
  assert stats["execute"] >= 0.8 * len(world.examples), stats
  assert stats["plan_accept"] > 0 and stats["plan_replan"] > 0 and stats["distill"] > 0
  assert {t["role"] for t in turns} == set(corpus.ROLES)
  # a small share: at most MAX_DISTILL_BATCHES per category (2.7% of a 400-question world)
  assert len(_of(turns, "apex_distill")) <= build.MAX_DISTILL_BATCHES * 10


def test_executor_turns_parse_and_answer_gold(compact, world):
  by_id = {e.id: e for e in world.examples}
  for turn in _of(compact[0], "apex_execute"):
    example, replies = by_id[turn["example_id"]], _replies(turn)
    parsed = [parse_turn(r) for r in replies]
    assert all(isinstance(p, ToolCall) for p in parsed[:-1]), parsed
    assert [p.queries for p in parsed[:-1]] == [[h.query] for h in example.chain]
    assert isinstance(parsed[-1], Answer) and parsed[-1].text == example.answers[0]
    for r, hop in zip(turn["rounds"], example.chain):  # the tool shows the hop's gold passage
      assert r["messages"][0]["content"].startswith("<tool_response>\nA search for ")
      assert json.dumps(hop.title)[1:-1] in r["messages"][0]["content"]


def test_planner_turns_parse(compact):
  for turn in _of(compact[0], "apex_plan"):
    replies = _replies(turn)
    assert all(think_balanced(r) for r in replies)
    assert prompts.after_think(replies[0]).startswith("1. Search ")
    decision = parse_decision(replies[1])
    assert decision.parsed and decision.exact and decision.replan == turn["replan"]
    assert len(replies) == (3 if turn["replan"] else 2)
    if turn["replan"]:
      assert prompts.after_think(replies[2]).startswith("1. ")


def test_distiller_replies_apply_to_a_bank(compact, tmp_path):
  distills = _of(compact[0], "apex_distill")
  assert {t["has_skill"] for t in distills} == {False, True}
  with MemoryBank(str(tmp_path / "m.db"), HashEmbedder()) as bank:
    for turn in distills:  # in order: a bucket's synthesis comes before its refinement
      ids = turn["memory_ids"]
      batch = [Memory(i, *turn["bucket"], "q", "w", "correct") for i in ids]
      result = bank.apply_distiller_reply(Bucket(*turn["bucket"]), turn["target"], batch=batch,
                                          strict=True)
      assert result.applied and result.operation == json.loads(turn["target"])["operation"]


def test_deterministic_by_seed(world, compact):
  again, _ = build.world_turns(world, COMPACT, seed=7)
  assert again == compact[0]
  other, _ = build.world_turns(world, COMPACT, seed=8)
  assert other != compact[0]


def test_plan_steps_hold_no_later_fact(world):
  example = next(e for e in world.examples if e.kind == "chain" and e.hops == 3)
  plan = corpus.numbered(corpus.plan_steps(example))
  for hop in example.chain[:-1]:
    assert hop.answer not in plan.split("\n", 1)[1]  # later steps name earlier results only
  assert "<result of step 1>" in plan and "<result of step 2>" in plan


def test_config_checks_fields():
  with pytest.raises(ValueError, match="CorpusConfig.plan_share"):
    corpus.CorpusConfig(plan_share=1.5)
  with pytest.raises(ValueError, match="CorpusConfig.distill_batch"):
    corpus.CorpusConfig(distill_batch=0)
