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
  assert {t["role"] for t in turns} == set(corpus.ROLES) - {"apex_judge", "apex_read"}  # opt-in
  # a small share: at most distill_batches per category (2.7% of a 400-question world)
  skills = [t for t in _of(turns, "apex_distill") if not t.get("summary")]
  assert len(skills) == stats["distill"] <= corpus.CorpusConfig().distill_batches * 10


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
  distills = [t for t in _of(compact[0], "apex_distill") if not t.get("summary")]
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


def test_planner_context_renders_as_the_bank_shows_it(compact, world):
  """A plan prompt's memories and skill are laid out as the run-time planner splits a bank's
  context (planner.context_slots), and the plan reply does not depend on them."""
  from apex_jax.agents.planner import context_slots
  from apex_jax.memory.records import PlannerContext

  plans, by_id = _of(compact[0], "apex_plan"), {e.id: e for e in world.examples}
  shown = [t for t in plans if "#### Positive Examples" in t["messages"][1]["content"]
           or "#### Negative Examples" in t["messages"][1]["content"]]
  skilled = [t for t in plans if "[Matched Skill Guidance]" in t["messages"][1]["content"]]
  assert 0.2 * len(plans) < len(shown) < 0.8 * len(plans) and skilled, (len(shown), len(plans))
  memories = [Memory(i, "comparison", corpus.MODALITY, f"q{i}", "1. search('a')", outcome)
              for i, outcome in enumerate(("correct", "incorrect", "correct", "correct"), 1)]
  skill_text, memory_text = corpus.planner_context("comparison", memories, with_skill=True)
  assert memory_text.count("\n#### ") == 2 and "q1" not in memory_text  # last two correct
  assert "q2" in memory_text and "q3" in memory_text and "q4" in memory_text
  skill = corpus.skill_reply("comparison", memories, None, [])["skill"]
  from apex_jax.memory.records import ProcedureStep, Skill
  doc = Skill("comparison", corpus.MODALITY, skill["skill_name"], skill["description"],
              tuple(ProcedureStep(**s) for s in skill["procedure"]), tuple(skill["pitfalls"]),
              1, 3, 4, "synthesize")
  ctx = PlannerContext(f"{skill_text}\n{memory_text}", Bucket("comparison", corpus.MODALITY),
                       (1, 2), doc, 0.75)
  assert context_slots(ctx) == (skill_text, memory_text)
  assert corpus.planner_context("comparison", memories, with_skill=False)[0] == prompts.NO_SKILL
  assert all(t["target"] == corpus.plan_reply(by_id[t["example_id"]]) for t in shown)


def test_summary_turns_are_the_workflow_of_a_run(compact, world):
  from apex_jax.agents.prompts import summary_messages

  summaries = [t for t in compact[0] if t.get("summary")]
  assert compact[1]["summary"] == len(summaries) > 0.1 * len(world.examples)
  by_id = {e.id: e for e in world.examples}
  for t in summaries:
    assert t["role"] == "apex_distill" and not t["rounds"]
    ex = by_id[t["example_id"].split(":", 1)[1]]
    body = t["messages"][0]["content"]
    assert body.startswith(summary_messages("", "compact")[0]["content"][:40])
    assert f"### Question: {ex.question}" in body
    lines = t["target"].splitlines()
    assert lines[-1].split(". ", 1)[1].startswith("answer '") and all(
        ln.split(". ", 1)[1].startswith("search(") for ln in lines[:-1])
