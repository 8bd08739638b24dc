"""The real agents in the training loops, driven by a scripted generator: group shapes, rewards
by the authors' rules, loss masks on generated tokens only, the TTRL episode and evolve hooks."""

import base64
import dataclasses
import io
import json

import jax
import numpy as np
import pytest
from PIL import Image

from apex_jax.agents import AgentConfig
from apex_jax.datasets import QAExample
from apex_jax.memory import Bucket, MemoryBank, MemoryConfig
from apex_jax.tools import render_tool_call
from apex_jax.training import rewards as rw
from apex_jax.training import rollouts, ttrl
from apex_jax.training.stages import StageConfig
from apex_jax.agents.trajectory import Trajectory
from morse_jax.rl.rollout import Segment, pack
from tests.apex.agents import fakes
from tests.apex.agents.test_executor_images import IMAGE_CALL, cache
from tests.apex.training import test_ttrl
from tests.apex.training.test_ttrl import OneHotEmbedder

RNG = jax.random.PRNGKey(0)
TIME = Bucket("time", "text-only")
EXAMPLES = [QAExample("a", "w40 w42", ("w7",), "time", 1),  # answered right at once
            QAExample("b", "w41 w42", ("w8",), "time", 1)]  # wrong, right after the replan
SKILL = {"operation": "synthesize", "absorbed_ids": [], "skill": {
    "skill_name": "dates", "category": "time", "modality": "text-only", "description": "d",
    "procedure": [{"step": 1, "action": "search", "purpose": "ground"}], "pitfalls": ["p"],
    "win_rate": 0.5, "version": 1, "evidence_count": 2}}


def question_of(prompt):
  return next(w for w in ("w40", "w41") if w in prompt.split())


def turn_of(prompt):
  return prompt.count("<|assistant|>") - 1


def reply(module, prompt, call):
  """executor: search, then w7 (right for w40, wrong for w41); after the replan w60, w8.
  planner: plan, then 'no' for w40 / 'yes' for w41, then the replan w60. distiller: a skill on
  even calls' rows... every row of a call gets the same text, so rows alternate via a counter."""
  q = question_of(prompt) if module != "distiller" else None
  if module == "executor":
    if "w60" in prompt.split():
      return "<think>w5</think><answer>w8</answer>"
    if turn_of(prompt) == 0:
      return f"<think>w9</think>{render_tool_call(['w20 w21'])}"
    return "<think>w5</think><answer>w7</answer>"
  if module == "planner":
    return ["<think>w20</think>w30 w31", "no" if q == "w40" else "yes",
            "<think>w21</think>w60"][turn_of(prompt)]
  reply.distiller_rows += 1
  return json.dumps(SKILL) if reply.distiller_rows % 2 else "w5 w6"


@pytest.fixture
def gen():
  reply.distiller_rows = 0
  return fakes.ScriptedGenerator(reply)


def bank_with_memories(tmp_path, n=3, **config):
  bank = MemoryBank(str(tmp_path / "m.db"), OneHotEmbedder(),
                    config=MemoryConfig(evolve_every=3, evolve_min_size=3, **config))
  for i in range(n):
    bank.add(f"w{50 + i} w42", "searched", i % 2 == 0, category="time", modality="text-only")
  return bank


def stage(module, g=2):
  return StageConfig(module, steps=1, batch_size=2, group_size=g, learning_rate=1e-3,
                     max_new_tokens=32)


def check_masks(groups, module):
  trajs = [t for g in groups for t in g]
  assert all(t.module == module for t in trajs)
  packed = pack([t.segments for t in trajs], pad_id=0)
  for row, t in enumerate(trajs):
    expected = np.concatenate([np.full(len(s.tokens), s.logprobs is not None)
                               for s in t.segments])
    np.testing.assert_array_equal(packed.loss_mask[row, :len(expected)], expected)
    assert packed.loss_mask[row].sum() == t.generated_tokens() > 0
    assert packed.loss_mask[row, len(expected):].sum() == 0


def test_executor_rollout_groups_rewards_and_one_batched_loop(gen, tmp_path):
  fn = rollouts.ExecutorRollout(fakes.FakeSearcher(), bank_with_memories(tmp_path), AgentConfig())
  groups, rewards = fn(EXAMPLES, gen, RNG, stage("executor", g=3))
  assert [len(g) for g in groups] == [3, 3]
  # right answer, a search, valid format: 0.7 + 0.2 + 0.1; wrong answer: 0.2 + 0.1
  assert rewards == [[pytest.approx(1.0)] * 3, [pytest.approx(0.3)] * 3]
  assert groups[1][0].info["reward"] == {"acc": 0.0, "tool": 1.0, "format": 1.0}
  # one plan per question, then every run of every question in each sampler call
  assert gen.calls == [("planner", 2), ("executor", 6), ("executor", 6)]
  assert all("w30" in gen.tokenizer.decode(t.segments[0].tokens).split()
             for g in groups for t in g)
  check_masks(groups, "executor")


def test_executor_accuracy_metric_and_validation(gen):
  examples = [QAExample("c", "w40 w42", ("w7 w9",), "time", 1)] * 2
  fn = rollouts.ExecutorRollout(fakes.FakeSearcher(), None, AgentConfig(), plan=False,
                                accuracy="f1")
  _, rewards = fn(examples, gen, RNG, stage("executor"))
  assert rewards[0][0] == pytest.approx(0.7 * 2 / 3 + 0.3)  # F1("w7", "w7 w9") = 2/3
  assert gen.calls[0] == ("executor", 4)  # no plan: the planner never ran
  with pytest.raises(ValueError, match="ExecutorRollout.accuracy 'acc'"):
    rollouts.ExecutorRollout(None, None, AgentConfig(), accuracy="acc")


def test_planner_rollout_scores_whole_episodes(gen, tmp_path):
  fn = rollouts.PlannerRollout(fakes.FakeSearcher(), bank_with_memories(tmp_path), AgentConfig())
  groups, rewards = fn(EXAMPLES, gen, RNG, stage("planner"))
  # w40: y1 right, 'no': 0.7 + 0.2 + 0.05 + 0.05; w41: y1 wrong, 'yes', y2 right: 0.7 + 0.1
  assert rewards == [[pytest.approx(1.0)] * 2, [pytest.approx(0.8)] * 2]
  assert groups[1][0].info["reward"]["acc_y2"] == 1.0
  assert groups[1][0].info["reward"]["acc_y1"] == 0.0
  # plan, decision and replan are trained on; prompts, judge and replan requests are not
  assert [s.logprobs is not None for s in groups[1][0].segments] == [False, True, False, True,
                                                                     False, True]
  check_masks(groups, "planner")


def test_distiller_rollout_scores_replies_without_applying_them(gen, tmp_path):
  bank = bank_with_memories(tmp_path)
  fn = rollouts.DistillerRollout(bank, AgentConfig())
  groups, rewards = fn([TIME, TIME], gen, RNG, stage("distiller"))
  assert gen.calls == [("distiller", 4)]
  good = rw.distiller_reward(json.dumps(SKILL), None).total
  assert good > 0.9 and rewards == [[good, 0.0], [good, 0.0]]  # no JSON scores 0
  assert bank.get_skill(TIME) is None  # rollouts never change the bank
  check_masks(groups, "distiller")
  judged = rollouts.DistillerRollout(bank, AgentConfig(), skill_judge=lambda *a: 0.0)
  _, rewards = judged([TIME, TIME], gen, RNG, stage("distiller"))
  assert rewards[0][0] == pytest.approx(good - 0.5 * rw.skill_quality_rules(SKILL))
  with pytest.raises(ValueError, match=r"bucket \('human', 'text-only'\) holds no memories"):
    fn([Bucket("human", "text-only")] * 2, gen, RNG, stage("distiller"))


def test_ttrl_episodes_and_the_evolve_hook(gen, tmp_path):
  bank = bank_with_memories(tmp_path)
  queries = [ttrl.Query(ex.question, category="time") for ex in EXAMPLES]
  contexts = [bank.planner_context(q.question, category="time") for q in queries]
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=32)
  groups = rollouts.TtrlEpisodes(fakes.FakeSearcher(), bank, AgentConfig())(
      queries, contexts, gen, RNG, cfg)
  assert [[e.answer for e in g] for g in groups] == [["w7", "w7"], ["w8", "w8"]]
  ep = groups[1][0]
  assert ep.trajectory.module == "planner" and ep.format_score == 1.0 and ep.plan == "w30 w31"
  assert ep.workflow.startswith("### Question: w41 w42") and ep.workflow.count("### Round") == 3
  # summaries on by default: one Distiller call over the 4 traces; its replies are stored, the
  # judges still read the trace (the scripted Distiller alternates a JSON reply and "w5 w6")
  assert gen.calls[-1] == ("distiller", 4)
  assert [e.summary for g in groups for e in g] == [json.dumps(SKILL), "w5 w6"] * 2
  plain = rollouts.TtrlEpisodes(fakes.FakeSearcher(), bank, AgentConfig(), summarize=False)(
      queries, contexts, gen, RNG, cfg)
  assert all(e.summary is None for g in plain for e in g) and gen.calls[-1][0] != "distiller"
  reply.distiller_rows = 0
  results = rollouts.evolve_with(AgentConfig())(bank, [TIME, TIME], gen, RNG)
  assert [r.applied for r in results] == [True]  # one reply per due bucket, applied
  assert bank.get_skill(TIME).procedure[0].action == "search"


def test_ttrl_episodes_carry_the_replan_memories(gen, tmp_path):
  bank = bank_with_memories(tmp_path)
  queries = [ttrl.Query(ex.question, category="time") for ex in EXAMPLES]
  contexts = [bank.planner_context(q.question, category="time") for q in queries]
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=32)
  groups = rollouts.TtrlEpisodes(fakes.FakeSearcher(), bank, AgentConfig(replan_memories=True),
                                 summarize=False)(queries, contexts, gen, RNG, cfg)
  # w40 never replans; w41 does and is shown k_replan (1) correct and 1 incorrect memory
  assert [e.replan_memory_ids for e in groups[0]] == [(), ()]
  replan = groups[1][0].replan_memory_ids
  assert sorted(bank.get(i).correct for i in replan) == [False, True]


def test_run_ttrl_uses_evolve_fn(tiny, tmp_path):
  bank = test_ttrl.make_bank(tmp_path)
  seen = []

  def evolve_fn(bank_, buckets, generator, rng):
    seen.append(list(buckets))
    due = [b for b in dict.fromkeys(buckets) if bank_.due_for_evolution(b)]
    return [bank_.apply_distiller_reply(b, test_ttrl.distill(b, bank_.evolution_batch(b), None))
            for b in due]

  cfg = ttrl.TtrlConfig(steps=2, batch_size=2, group_size=2, learning_rate=test_ttrl.LR)
  def episode_fn(batch, contexts, generator, rng, config):
    traj = Trajectory("planner", [Segment([5, 6]), Segment([7], [-0.5])], "w7", "w7")
    return [[ttrl.PlannerEpisode(traj, "plan", "right", f"looked up {q.question}", 1.0)] * 2
            for q in batch]

  # equal rewards in every group: the update is skipped, so nothing compiles
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, test_ttrl.queries(4), bank, object(),
                         episode_fn,
                         test_ttrl.FakeJudges(), None, evolve_fn=evolve_fn, config=cfg,
                         rng=jax.random.key(0))
  assert seen == [[test_ttrl.BUCKET] * 2] * 2
  assert [h["skipped"] for h in result.history] == [1.0, 1.0]
  assert result.history[1]["evolutions_applied"] == 1.0
  assert "evolutions_applied" not in result.history[0]
  assert bank.get_skill(test_ttrl.BUCKET) is not None
  with pytest.raises(ValueError, match="give distill_fn or evolve_fn"):
    ttrl.run_ttrl(tiny.updater(), tiny.experts, test_ttrl.queries(2), bank, object(),
                  None, None, None, config=cfg, rng=RNG)


# ------------------------------------------------- R_acc from the judge, quality from the judge


def correctness_chat(reply_of):
  """An LLM judge over a scripted chat: reply_of(question line, predicted answer) -> reply."""
  from apex_jax.judges import LlmJudge
  from tests.apex.judges.fakes import ScriptedChat

  def reply(prompt):
    question = next(w for w in ("w40", "w41") if w in prompt.split())
    predicted = prompt.split("Predicted answer: ")[-1].split()[0]
    return reply_of(question, predicted)

  chat = ScriptedChat(reply)
  return chat, LlmJudge(chat)


def test_executor_rollout_acc_from_the_judge_with_a_counted_rule_fallback(gen):
  from apex_jax.training.accuracy import JudgedAccuracy

  # w40's answer w7 (EM right): the judge's reply is unreadable -> EM 1; w41's answer w7 (EM
  # wrong): the judge says A (correct) -> 1. By EM alone the rewards would be 1.0 and 0.3.
  chat, judge = correctness_chat(lambda q, pred: "no idea" if q == "w40" else "A")
  fn = rollouts.ExecutorRollout(fakes.FakeSearcher(), None, AgentConfig(), plan=False,
                                accuracy=JudgedAccuracy(judge, fallback="em"))
  groups, rewards = fn(EXAMPLES, gen, RNG, stage("executor", g=3))
  assert rewards == [[pytest.approx(1.0)] * 3, [pytest.approx(1.0)] * 3]
  assert chat.calls == [(6, 64, 0.0)]  # every answer in one batched judge call
  assert fn.metrics == {"judge_calls": 6.0, "judge_fallbacks": 3.0}
  assert judge.failures.snapshot()["unparseable"] == 3
  # the judge says B for everything: the EM-right answer scores 0 -> 0.2 tool + 0.1 format
  _, judge_b = correctness_chat(lambda q, pred: "B")
  fn = rollouts.ExecutorRollout(fakes.FakeSearcher(), None, AgentConfig(), plan=False,
                                accuracy=JudgedAccuracy(judge_b))
  _, rewards = fn(EXAMPLES, gen, RNG, stage("executor"))
  assert rewards == [[pytest.approx(0.3)] * 2] * 2
  assert fn.metrics == {"judge_calls": 4.0, "judge_fallbacks": 0.0}


def test_planner_rollout_acc_from_the_judge(gen, tmp_path):
  from apex_jax.training.accuracy import JudgedAccuracy

  # The judge calls every answer wrong. w40: y1 'wrong', kept ('no'): decision 0, format 1
  # -> 0.05. w41: y1 wrong, replanned ('yes'): decision 1, y2 (w8) wrong too -> 0.1.
  chat, judge = correctness_chat(lambda q, pred: "B")
  fn = rollouts.PlannerRollout(fakes.FakeSearcher(), bank_with_memories(tmp_path), AgentConfig(),
                               accuracy=JudgedAccuracy(judge))
  _, rewards = fn(EXAMPLES, gen, RNG, stage("planner"))
  assert rewards == [[pytest.approx(0.05)] * 2, [pytest.approx(0.1)] * 2]
  # y1 of 4 episodes and y2 of the 2 replanned ones, in one call
  assert chat.calls == [(6, 64, 0.0)] and fn.metrics["judge_calls"] == 6.0
  # judged right only for y2 = w8: w41 -> 0.7 acc(y2) + 0.05 + 0.05; w40 as before
  chat, judge = correctness_chat(lambda q, pred: "A" if pred == "w8" else "B")
  fn = rollouts.PlannerRollout(fakes.FakeSearcher(), fn.bank, AgentConfig(),
                               accuracy=JudgedAccuracy(judge))
  _, rewards = fn(EXAMPLES, gen, RNG, stage("planner"))
  assert rewards == [[pytest.approx(0.05)] * 2, [pytest.approx(0.8)] * 2]


@pytest.mark.parametrize("letter, quality, fallbacks", [
    ("A", 1.0, 0), ("B", 0.5, 0), ("Grade: C", 0.0, 0),
    ("it depends", None, 2)])  # unreadable: the rule-based quality (1.0 for SKILL), counted
def test_distiller_rollout_quality_from_the_skill_judge(gen, tmp_path, letter, quality,
                                                        fallbacks):
  from apex_jax.judges import SkillJudge
  from tests.apex.judges.fakes import ScriptedChat

  chat = ScriptedChat(lambda prompt: letter)
  fn = rollouts.DistillerRollout(bank_with_memories(tmp_path), AgentConfig(),
                                 skill_judge=SkillJudge(chat))
  _, rewards = fn([TIME, TIME], gen, RNG, stage("distiller"))
  # SKILL: format 1, synthesize on an empty bucket 1, rule quality 1 -> 0.5 q + 0.1 + 0.4
  assert rw.skill_quality_rules(SKILL) == pytest.approx(1.0)
  good = 0.5 * (1.0 if quality is None else quality) + 0.5
  assert rewards == [[pytest.approx(good), 0.0]] * 2  # "w5 w6": no JSON, 0, never sent
  assert chat.calls == [(2, 16, 0.1)]
  assert fn.metrics == {"skill_judge_calls": 2.0, "skill_judge_fallbacks": float(fallbacks)}
  prompt = chat.prompts[0]
  assert "searched" in prompt and '"skill_name": "dates"' in prompt  # memories and the reply
  assert "**Current skill (null: there was none):**\nnull" in prompt


def test_distiller_rollout_format_and_evolution_judged_per_term(gen, tmp_path):
  """judges.skill_terms "judge": a SkillJudge per term replaces its rule. SKILL on an empty
  bucket: rule quality 1, format B -> 0.5, evolution C -> 0:
    R = 0.5 * 1 + 0.1 * 0.5 + 0.4 * 0 = 0.55 (the rules' 0.5 + 0.1 + 0.4 = 1.0)."""
  from apex_jax.judges import SkillJudge, SkillJudgeConfig
  from tests.apex.judges.fakes import ScriptedChat

  chats = {"format": ScriptedChat(lambda prompt: "B"),
           "evolution": ScriptedChat(lambda prompt: "C")}
  fn = rollouts.DistillerRollout(bank_with_memories(tmp_path), AgentConfig(), term_judges={
      term: SkillJudge(chat, SkillJudgeConfig(term=term)) for term, chat in chats.items()})
  groups, rewards = fn([TIME, TIME], gen, RNG, stage("distiller"))
  assert rewards == [[pytest.approx(0.55), 0.0]] * 2  # no JSON: 0, never sent
  assert groups[0][0].info["reward"] == {"quality": 1.0, "format": 0.5, "evolution": 0.0}
  assert fn.metrics == {"skill_format_judge_calls": 2.0, "skill_format_judge_fallbacks": 0.0,
                        "skill_evolution_judge_calls": 2.0,
                        "skill_evolution_judge_fallbacks": 0.0}
  assert "check the format" in chats["format"].prompts[0]
  assert "chose the right operation" in chats["evolution"].prompts[0]
  with pytest.raises(ValueError, match=r"SkillJudgeConfig.term 'style' not in"):
    SkillJudgeConfig(term="style")
  (tmp_path / "b").mkdir()
  bad = rollouts.DistillerRollout(bank_with_memories(tmp_path / "b"), AgentConfig(),
                                  term_judges={"style": None})
  with pytest.raises(ValueError, match=r"term_judges: \['style'\] not in"):
    bad([TIME, TIME], gen, RNG, stage("distiller"))


def test_distiller_reward_term_grades_by_hand():
  text = json.dumps(SKILL)
  # no current skill, synthesize: rules give format 1, evolution 1, quality 1 (SKILL)
  assert rw.distiller_reward(text, None).total == pytest.approx(1.0)
  got = rw.distiller_reward(text, None, 0.5, format_grade=0.0, evolution_grade=0.5)
  assert got.total == pytest.approx(0.5 * 0.5 + 0.1 * 0.0 + 0.4 * 0.5)
  assert rw.distiller_reward("no json", None, 1.0, format_grade=1.0,
                             evolution_grade=1.0).total == 0.0


def test_image_examples_bring_caption_image_and_cache_id_to_the_agents(gen, tmp_path):
  buffer = io.BytesIO()
  Image.new("RGB", (8, 8), (3, 4, 5)).save(buffer, "PNG")
  image = base64.b64encode(buffer.getvalue()).decode()
  examples = [QAExample("img1", " w40", ("w7",), "time", 1, images=(image,), caption="w70"),
              QAExample("txt1", "w41", ("w7",), "time", 1)]
  fn = rollouts.ExecutorRollout(fakes.FakeSearcher(), bank_with_memories(tmp_path),
                                AgentConfig())
  groups, _ = fn(examples, gen, RNG, stage("executor", g=2))
  first = groups[0][0].info
  assert first["has_image"] and first["data_id"] == "img1" and len(first["images"]) == 1
  np.testing.assert_array_equal(first["images"][0][0, 0], [3, 4, 5])
  assert not groups[1][0].info["has_image"] and groups[1][0].info["data_id"] is None
  # the word-level test vocabulary keeps only the w-words: the question, then its caption
  plan_prompts = [gen.tokenizer.decode(p).split() for p in gen.prompts[:2]]
  assert plan_prompts[0][-2:] == ["w40", "w70"] and "w70" not in plan_prompts[1]


def test_ttrl_image_queries_show_their_image_and_may_call_the_image_search(tmp_path):
  buffer = io.BytesIO()
  Image.new("RGB", (8, 8), (3, 4, 5)).save(buffer, "PNG")
  image = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

  def replies(module, prompt, call):  # every executor calls the image search first
    if module != "executor":
      return reply(module, prompt, call)
    return IMAGE_CALL if turn_of(prompt) == 0 else "<think>w5</think><answer>w7</answer>"

  reply.distiller_rows = 0
  bank = bank_with_memories(tmp_path)
  queries = [ttrl.Query(" w40", "w70", category="time", data_id="q1", images=(image,)),
             ttrl.Query("w41", category="time")]
  contexts = [bank.planner_context(q.question, q.caption, category="time") for q in queries]
  fn = rollouts.TtrlEpisodes(fakes.FakeSearcher(), bank, AgentConfig(), summarize=False,
                             image_search=cache(tmp_path))
  groups = fn(queries, contexts, fakes.ScriptedGenerator(replies), RNG,
              ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=16))
  for ep in groups[0]:  # the image query's runs: the results came back, then the answer
    assert "[Image Search Results]" in ep.workflow and "title: w20" in ep.workflow
    assert ep.answer == "w7"
  for ep in groups[1]:  # the text query is offered no image tool: its call gets no results
    assert "web_image_to_image_search" in ep.workflow and "Image Search Results" not in ep.workflow
  # a text query's run identity is what it was before queries carried images (runs resume)
  assert queries[1].identity() == dataclasses.astuple(queries[1])[:5]
  assert queries[0].identity()[-1] == (image,)
