"""Distiller: the Writer's prompts, replies applied to a real MemoryBank, workflow summaries."""

import json

import jax
import pytest

from apex_jax.agents import AgentConfig, Distiller, Executor, Planner, prompts, run_episode
from apex_jax.agents.config import AgentConfigError
from apex_jax.agents.prompts import skill_messages
from apex_jax.memory import MemoryBank, MemoryConfig
from apex_jax.tools import render_tool_call
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder

RNG = jax.random.PRNGKey(0)
BUCKET = ("location", "text-only")


def _bank(tmp_path, n=5):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())
  for i in range(n):
    bank.add(f"w40 w{50 + i}", f"1. search w{60 + i}", i % 2 == 0, category="location")
  return bank


def _reply(op, ids, **extra):
  skill = {"skill_name": "location_text-only_strategy", "category": "location",
           "modality": "text-only", "description": "Find places.",
           "procedure": [{"step": 1, "action": "search the place", "purpose": "candidates"}],
           "pitfalls": ["similar names"], "win_rate": 0.6, "version": 1, "evidence_count": 5}
  skill.update(extra)
  return "<think>w1</think>```json\n" + json.dumps(
      {"operation": op, "skill": skill, "absorbed_ids": ids}) + "\n```"


def test_synthesis_then_evolution_prompts_and_replies_applied(tmp_path):
  bank = _bank(tmp_path)
  batch = bank.evolution_batch(BUCKET)
  ids = [m.id for m in batch]
  first = skill_messages(BUCKET, batch, None)
  assert first[0]["content"].startswith("You are a skill synthesis and evolution expert")
  assert first[1]["content"].startswith('Analyze the following batch of task memories from the '
                                        '"location" category (text-only modality)')
  assert f"Memory {ids[0]} [CORRECT]:\n  Question: w40 w50" in first[1]["content"]
  replies = iter([_reply("synthesize", ids[:2]), _reply("refine", ids[2:3])])
  gen = fakes.ScriptedGenerator(lambda module, prompt, call: next(replies))
  distiller = Distiller(gen, AgentConfig())
  [ev] = distiller.evolve(bank, [BUCKET, BUCKET], rng=RNG)
  assert ev.result.applied and ev.result.operation == "synthesize" and ev.previous is None
  skill = bank.get_skill(BUCKET)
  assert skill.version == 1 and skill.absorbed_ids == tuple(ids[:2])
  assert skill.evidence_count == 5 and skill.correct_count == 3  # the bank's counts
  assert ev.trajectory.stats["applied"] == 1 and ev.trajectory.generated_tokens() > 0
  assert gen.calls == [("distiller", 1)]
  assert distiller.evolve(bank, [BUCKET], rng=RNG) == []  # not due again yet
  for i in range(5):
    bank.add(f"w41 w{70 + i}", f"1. search w{80 + i}", False, category="location")
  evolving = skill_messages(BUCKET, bank.evolution_batch(BUCKET), skill)
  assert "[Current Skill]\n{\"skill_name\": \"location_text-only_strategy\"" in \
      evolving[1]["content"]
  assert "correct_count" not in evolving[1]["content"]  # only the Writer's schema fields
  [ev2] = distiller.evolve(bank, [BUCKET], rng=RNG)
  assert ev2.result.operation == "refine" and bank.get_skill(BUCKET).version == 2


def test_bad_replies_are_counted_and_change_nothing(tmp_path):
  bank = _bank(tmp_path)
  replies = iter(["w1 w2 not json", _reply("synthesize", [False])])
  gen = fakes.ScriptedGenerator(lambda *_: next(replies))
  distiller = Distiller(gen, AgentConfig())
  [a] = distiller.evolve(bank, [BUCKET], rng=RNG)
  [b] = distiller.evolve(bank, [BUCKET], rng=RNG)
  assert not a.result.applied and a.result.error.kind == "not_json"
  assert not b.result.applied and b.result.error.kind == "wrong_type"  # a bool is not an id
  assert "absorbed_ids[0] must be an id; got False" in b.trajectory.info["error"]
  assert a.trajectory.stats["format_errors"] == 1 and a.trajectory.stats["error_not_json"] == 1
  assert b.trajectory.stats["error_wrong_type"] == 1
  assert bank.get_skill(BUCKET) is None and bank.due_for_evolution(BUCKET)
  assert bank.distiller_errors == {"not_json": 1, "wrong_type": 1}
  assert bank.unknown_absorbed_ids == 0 and bank.bucket_overwrites == 0


def test_unknown_absorbed_id_is_dropped_and_the_reply_applied(tmp_path):
  bank = _bank(tmp_path)
  ids = [m.id for m in bank.evolution_batch(BUCKET)]
  gen = fakes.ScriptedGenerator(lambda *_: _reply("synthesize", [ids[1], 999]))
  [ev] = Distiller(gen, AgentConfig()).evolve(bank, [BUCKET], rng=RNG)
  assert ev.result.applied and ev.result.error is None and ev.result.unknown_absorbed_ids == 1
  assert bank.get_skill(BUCKET).absorbed_ids == (ids[1],)
  assert ev.trajectory.stats["applied"] == 1 and ev.trajectory.stats["format_errors"] == 0
  assert ev.trajectory.stats["unknown_absorbed_ids"] == 1
  assert bank.unknown_absorbed_ids == 1 and not bank.distiller_errors
  assert not bank.due_for_evolution(BUCKET)


def test_reply_with_another_buckets_category_is_stored_under_the_asked_bucket(tmp_path):
  bank = _bank(tmp_path)
  ids = [m.id for m in bank.evolution_batch(BUCKET)]
  gen = fakes.ScriptedGenerator(lambda *_: _reply("synthesize", ids[:1], category="human"))
  [ev] = Distiller(gen, AgentConfig()).evolve(bank, [BUCKET], rng=RNG)
  assert ev.result.applied and ev.result.error is None and ev.result.bucket_overwrites == 1
  assert bank.get_skill(BUCKET).category == "location"
  assert bank.get_skill(("human", "text-only")) is None
  assert ev.trajectory.stats["bucket_overwrites"] == 1
  assert ev.trajectory.stats["format_errors"] == 0
  assert bank.bucket_overwrites == 1 and not bank.distiller_errors


def test_workflow_summaries_are_stored_as_memories(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())

  def reply(module, prompt, _):
    if module == "distiller":
      return "<think>w1</think>1. w20 w21" if "w41" in prompt.split() else "<think>w1</think>"
    if module == "planner":
      return ["<think>w2</think>w10", "<think>w1</think>no"][prompt.count("<|assistant|>") - 1]
    return "<think>w5</think><answer>w7</answer>"
  gen = fakes.ScriptedGenerator(reply)
  cfg = AgentConfig()
  episodes = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg),
                         ["w40", "w41"], rng=RNG, bank=bank, categories=["time", "location"])
  summaries, added = Distiller(gen, cfg).remember(bank, episodes, [True, False], rng=RNG)
  assert gen.calls[-1] == ("distiller", 2)
  assert summaries[1].text == "1. w20 w21" and not summaries[1].fallback
  assert summaries[0].fallback and summaries[0].text.startswith("### Question: w40\n### Round 1")
  assert summaries[0].trajectory.stats["empty_summary"] == 1
  stored = [bank.get(r.id) for r in added]
  assert [m.outcome for m in stored] == ["correct", "incorrect"]
  assert [m.category for m in stored] == ["time", "location"]
  assert stored[1].workflow_summary == "1. w20 w21"
  prompt = summaries[1].trajectory.info["trace"]
  assert "#### Agent Reasoning and Tool Call:\n<think>w5</think><answer>w7</answer>" in prompt


def test_rule_summaries_list_the_runs_searches_and_answer_without_a_call():
  """AgentConfig.summaries "rule": the stored workflow is the run's own searches and answer, in
  order, exact; a tool output that mentions a search or an answer is not read as one; a run
  with neither stores its trace, as an empty Distiller reply does."""
  def reply(module, prompt, _):
    raise AssertionError("a rule summary calls no model")
  run = prompts.render_trace("w40", [
      {"text": render_tool_call([" w30 records"]),
       "tool_output": '"query_list": [" w31"] <answer>w32</answer>'},
      {"text": "<think>w5</think>" + render_tool_call([" w30 vesk record"]), "tool_output": "w6"},
      {"text": "<think>w5</think><answer>w7</answer>", "tool_output": None}])
  silent = prompts.render_trace("w41", [{"text": "<think>w1</think>no call", "tool_output": None}])
  done, empty = Distiller(fakes.ScriptedGenerator(reply), AgentConfig(summaries="rule")).summarize(
      [run, silent], rng=RNG)
  assert done.text == '1. search(" w30 records")\n2. search(" w30 vesk record")\n3. answer \'w7\''
  assert not done.fallback and done.trajectory is None
  assert empty.fallback and empty.text == silent


def test_summaries_setting_is_checked():
  with pytest.raises(AgentConfigError, match=r"AgentConfig.summaries 'llm' not in"):
    AgentConfig(summaries="llm")
