"""Planner: decision parsing and its fallback, word limits, context slots, the episode loop."""

import jax
import pytest

from apex_jax.agents import AgentConfig, Executor, Planner, parse_decision, run_episode
from apex_jax.agents.planner import context_slots
from apex_jax.memory import MemoryBank, MemoryConfig
from morse_jax.rl.rollout import pack
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder

RNG = jax.random.PRNGKey(0)
ANSWER = "<think>w5</think><answer>w7</answer>"
SECOND_ANSWER = "<think>w5</think><answer>w8</answer>"


@pytest.mark.parametrize("text,replan,parsed,exact", [
    ("<think>w1</think>yes", True, True, True),
    ("<think>w1</think>\nNo", False, True, True),
    ("<think>w1</think>I think yes, replan.", True, True, False),
    ('<think>w1</think>{"replan": true}', True, True, False),
    ('{"decision": "no"}', False, True, False),
    ("<think>nothing yes here</think>the trace is fine", False, False, False),
    ("yesterday", False, False, False),  # the authors' substring test would say yes
    ("", False, False, False),
])
def test_parse_decision(text, replan, parsed, exact):
  d = parse_decision(text)
  assert (d.replan, d.parsed, d.exact) == (replan, parsed, exact)


def planner_script(decision="<think>w1</think>yes", plan="<think>w2</think>w10 w11 w12"):
  """Planner turns by position in its conversation; executor: answer, then a second answer."""
  def reply(module, prompt, _):
    turn = prompt.count("<|assistant|>") - 1
    if module == "planner":
      return [plan, decision, "<think>w3</think>w13 w14"][turn]
    return ANSWER if "revised" not in prompt and turn == 0 else SECOND_ANSWER
  return reply


def test_episode_with_replan_has_one_planner_conversation_and_two_runs():
  gen = fakes.ScriptedGenerator(planner_script())
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG)
  assert ep.decision.replan and ep.format_ok
  assert (ep.y1, ep.y2) == ("w7", "w8")
  assert ep.plan == "w10 w11 w12" and ep.replan == "w13 w14"
  assert [s.logprobs is not None for s in ep.planner.segments] == [False, True, False, True,
                                                                   False, True]
  assert ep.planner.stats["llm_calls"] == 3 and ep.planner.answer == "w8"
  assert len(ep.executor) == 2
  first_prompt = ep.executor[0].info["messages"][0]["content"]
  assert first_prompt.endswith("Here is a guide for your reference:\nw10 w11 w12\nBegin your "
                               "answer:\n")
  judge = ep.planner.info["messages"][3]["content"]
  assert "### Round 1:\n#### Agent Reasoning and Tool Call:\n" + ANSWER in judge
  assert gen.calls == [("planner", 1), ("executor", 1), ("planner", 1), ("planner", 1),
                       ("executor", 1)]
  packed = pack([ep.planner.segments], pad_id=0)
  assert packed.loss_mask.sum() == ep.planner.generated_tokens()


def test_no_replan_keeps_y1_and_a_batch_splits():
  def reply(module, prompt, call):
    if module == "planner" and prompt.count("<|assistant|>") == 2:  # the decision turn
      return "<think>w1</think>yes" if "w41" in prompt.split() else "<think>w1</think>no"
    return planner_script()(module, prompt, call)
  gen = fakes.ScriptedGenerator(reply)
  cfg = AgentConfig()
  a, b = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg),
                     ["w40", "w41"], rng=RNG)
  assert not a.decision.replan and (a.y1, a.y2) == ("w7", "w7") and len(a.executor) == 1
  assert a.replan is None and a.planner.stats["llm_calls"] == 2
  assert b.decision.replan and (b.y1, b.y2) == ("w7", "w8")
  assert gen.calls == [("planner", 2), ("executor", 2), ("planner", 2), ("planner", 1),
                       ("executor", 1)]


def test_unparseable_decision_is_counted_and_means_no_replan():
  gen = fakes.ScriptedGenerator(planner_script(decision="w1 w2 w3"))
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG)
  assert not ep.decision.replan and not ep.decision.parsed and not ep.format_ok
  assert ep.planner.stats["decision_unparsed"] == 1 and len(ep.executor) == 1


def test_plan_word_limit_is_measured_counted_and_enforced():
  long_plan = "<think>w1</think>" + " ".join(f"w{10 + i % 50}" for i in range(30))
  gen = fakes.ScriptedGenerator(planner_script(plan=long_plan, decision="no"))
  [run] = Planner(gen, AgentConfig(plan_word_limit=8)).plan(["w40"], [None], rng=RNG)
  assert run.stats["plan_words"] == 30 and run.stats["plan_over_limit"] == 1
  assert len(run.plan.split()) == 8
  [kept] = Planner(gen, AgentConfig(plan_word_limit=8, enforce_word_limit=False)).plan(
      ["w40"], [None], rng=RNG)
  assert len(kept.plan.split()) == 30 and kept.stats["plan_over_limit"] == 1


def test_unbalanced_think_fails_the_format_check():
  gen = fakes.ScriptedGenerator(planner_script(plan="<think>w2 w10 w11", decision="no"))
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG)
  assert ep.decision.exact and not ep.format_ok and ep.planner.stats["think_unbalanced"] == 1


def test_episode_with_memory_bank_shows_skill_and_memories_and_k1_on_replan(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())
  for i in range(4):
    bank.add(f"w40 w{50 + i}", f"1. search w{60 + i}", i % 2 == 0, category="location")
  gen = fakes.ScriptedGenerator(planner_script())
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG, bank=bank, categories=["location"])
  plan_prompt = ep.planner.info["messages"][1]["content"]
  assert "No skill available for this question type." in plan_prompt
  assert "#### Positive Examples (Successful Strategies - 2)" in plan_prompt
  assert len(ep.context.memory_ids) == 4  # k = 2 correct + 2 incorrect
  assert len(ep.replan_memory_ids) == 2  # k_replan = 1 of each
  replan_prompt = ep.planner.info["messages"][5]["content"]
  assert "### [Relevant Memories]" in replan_prompt and "Successful Strategies - 1" in \
      replan_prompt
  assert set(ep.memory_ids) == set(ep.context.memory_ids)  # the top-1 were shown before
  no_mem = AgentConfig(replan_memories=False)
  [bare] = run_episode(Planner(gen, no_mem), Executor(gen, fakes.FakeSearcher(), no_mem),
                       ["w40"], rng=RNG, bank=bank, categories=["location"])
  assert "[Relevant Memories]" not in bare.planner.info["messages"][5]["content"]


def test_context_slots_split_skill_from_memories(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())
  for i in range(5):
    bank.add(f"w40 w{50 + i}", f"1. search w{60 + i}", True, category="location")
  reply = ('{"operation": "synthesize", "skill": {"description": "d", "procedure": [{"step": 1, '
           '"action": "search the name", "purpose": "find"}], "pitfalls": ["p1"]}, '
           '"absorbed_ids": []}')
  assert bank.apply_distiller_reply(("location", "text-only"), reply).applied
  ctx = bank.planner_context("w40 w50", category="location")
  skill, memory = context_slots(ctx)
  assert skill.startswith("### [Matched Skill Guidance]") and "1. search the name" in skill
  assert memory.startswith("### Retrieved Relevant Memories:") and "Matched Skill" not in memory
  assert context_slots(None)[0] == "No skill available for this question type."
