"""Skill-guided TTRL with fake judges and episodes: rewards, memories, evolution, the gate."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from apex_jax.judges.chat import JudgeError
from apex_jax.memory import Bucket, MemoryBank, MemoryConfig
from apex_jax.training import ttrl

from tests.apex.training.conftest import STEP

BUCKET = Bucket("time", "text-only")
LR = STEP.expert_lr  # the shared step config: no second compile of the update
SKILL_REPLY = {"operation": "synthesize", "absorbed_ids": [], "skill": {
    "skill_name": "dates", "category": "time", "modality": "text-only",
    "description": "find dates", "procedure": [{"step": 1, "action": "search the date",
                                                "purpose": "ground it"}],
    "pitfalls": ["calendar systems"], "win_rate": 1.0, "version": 1, "evidence_count": 1}}


class OneHotEmbedder:
  """A new basis vector for every new text: distinct questions never count as duplicates (a
  hashed embedding can collide and dedup them away); the same question always does."""

  def __init__(self, dim: int = 64):
    self.dim, self.index = dim, {}

  def __call__(self, texts):
    rows = [self.index.setdefault(t, len(self.index)) for t in texts]
    return np.eye(self.dim, dtype=np.float32)[rows]


class FakeJudges:
  """Arbiter: 'right' answers are correct; one answer breaks the judge, one gets a bad score."""

  def __init__(self):
    self.alignments = 0

  def arbiter(self, question, workflow, answer):
    if answer == "boom":
      raise JudgeError("judge server down")
    return {"right": 1.0, "wrong": 0.0, "weird": 7.0}[answer]

  def alignment(self, plan, skill):
    self.alignments += 1
    return 0.5


def episode_fn_for(tiny, answers):
  groups = tiny.groups("planner")

  def episode_fn(batch, contexts, generator, rng, config):
    assert len(contexts) == len(batch) and all(c.bucket == BUCKET for c in contexts)
    return [[ttrl.PlannerEpisode(t, plan="search then answer", answer=answers[j],
                                 workflow=f"looked up {q.question}", format_score=1.0)
             for j, t in enumerate(groups[i])] for i, q in enumerate(batch)]
  return episode_fn


def queries(n):
  return [ttrl.Query(f"when did event number {i} happen", category="time",
                     modality="text-only") for i in range(n)]


def distill(bucket, batch, skill):
  return json.dumps({**SKILL_REPLY, "absorbed_ids": [m.id for m in batch[:1]]})


def make_bank(tmp_path, **config):
  return MemoryBank(str(tmp_path / "m.db"), OneHotEmbedder(),
                    config=MemoryConfig(evolve_every=3, evolve_min_size=3, **config))


def test_ttrl_writes_memories_and_evolves_a_skill(tiny, tmp_path):
  bank = make_bank(tmp_path)
  cfg = ttrl.TtrlConfig(steps=2, batch_size=2, group_size=2, learning_rate=LR)
  judges = FakeJudges()
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(4), bank, object(),
                         episode_fn_for(tiny, ["right", "wrong"]), judges, distill, config=cfg,
                         rng=jax.random.key(0), logdir=str(tmp_path / "logs"))
  first, second = result.history
  # no skill yet: R = 0.9 arbiter + 0.1 format -> 1.0 and 0.1 in every group
  assert first["reward_mean"] == pytest.approx(0.55) and first["skipped"] == 0.0
  assert first["lambda_mean"] == 0.0 and judges.alignments == 0
  # one memory per question: the wrong episode duplicates the right one's question and is
  # dropped by the bank's dedup (a correct old memory is kept)
  assert first["memories_stored"] == 2 and second["memories_stored"] == 2
  # 4 questions >= evolve_every 3: the Distiller's skill is applied after the second batch
  assert second["evolutions_applied"] == 1.0 and "evolutions_applied" not in first
  skill = bank.get_skill(BUCKET)
  assert skill is not None and skill.procedure[0].action == "search the date"
  assert len(bank) == 4 and all(m.correct for m in bank.memories(BUCKET))


@pytest.mark.parametrize("store, stored, memories", [("all", 4, 2), ("best", 2, 2),
                                                     ("majority", 0, 0), ("none", 0, 0)])
def test_store_all_or_each_querys_best_episode(tiny, tmp_path, store, stored, memories):
  """Per query a wrong then a right episode (rewards 0.1, 1.0). "all": both stored, the right
  one replacing the wrong one (same question: dedup), 2 stores per query; "best": only the
  right one; either way the bank ends with one correct memory per question. "majority": the two
  answers tie, so no majority and nothing stored; "none": nothing stored."""
  bank = make_bank(tmp_path)
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR, store=store)
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(2), bank, object(),
                         episode_fn_for(tiny, ["wrong", "right"]), FakeJudges(), distill,
                         config=cfg, rng=jax.random.key(0))
  assert result.history[0]["memories_stored"] == stored
  assert len(bank) == memories and all(m.correct for m in bank.memories(BUCKET))
  with pytest.raises(ValueError, match=r"TtrlConfig.store 'some' not in \('all', 'best', "):
    ttrl.TtrlConfig(steps=1, batch_size=1, group_size=2, store="some")


def test_majority_store_keeps_the_best_episode_of_the_majority_answer():
  """By hand: answers 'Paris', 'paris.', 'Rome', 'Paris' (3 of 4 agree after normalising):
  the best-rewarded of the three, the earlier on a tie; 2 of 4 is no majority; an empty
  majority answer is not one; incomplete episodes (episode 0 below, reward 9) neither vote nor
  are stored."""
  answers = ["Paris", "paris.", "Rome", "Paris"]
  assert ttrl._stored("majority", [0, 1, 2, 3], [0.2, 0.9, 1.0, 0.9], answers) == {1}
  assert ttrl._stored("best", [0, 1, 2, 3], [0.2, 0.9, 1.0, 0.9], answers) == {2}
  assert ttrl._stored("majority", [0, 2], [1.0, 0.0, 1.0, 0.0], answers) == set()
  assert ttrl._stored("majority", [0, 1, 2], [0.0, 0.0, 0.0], ["", " ", "x"]) == set()
  assert ttrl._stored("majority", [1, 2, 3], [9.0, 0.5, 0.1, 0.5], answers) == {1}
  assert ttrl._stored("none", [0, 1], [1.0] * 4, answers) == set()
  assert ttrl._stored("all", [0, 2], [1.0] * 4, answers) == {0, 2}
  assert ttrl._stored("majority", [], [], []) == set()


def test_skill_alignment_and_lambda_enter_the_reward(tiny, tmp_path):
  bank = make_bank(tmp_path)
  for i in range(10):  # a skill with w = 1, n = 10: confidence 1, l_s = 0.1
    bank.add(f"what year was thing {i} built", "searched", True, category="time",
             modality="text-only")
  assert len(bank) == 10
  assert bank.apply_distiller_reply(BUCKET, distill(BUCKET, bank.memories(BUCKET), None),
                                    batch=bank.memories(BUCKET)).applied
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR)
  judges = FakeJudges()
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(2), bank, object(),
                         episode_fn_for(tiny, ["right", "wrong"]), judges, distill, config=cfg,
                         rng=jax.random.key(0))
  # right: 0.9 * 1.0 + 0.1 * 0.5 = 0.95; wrong: 0.9 * 0.1 + 0.1 * 0.5 = 0.14
  assert result.history[0]["reward_mean"] == pytest.approx((0.95 + 0.14) / 2)
  assert result.history[0]["lambda_mean"] == pytest.approx(0.1) and judges.alignments == 4


def test_judge_failures_are_counted_not_fatal(tiny, tmp_path):
  bank = make_bank(tmp_path)
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR)
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(2), bank, object(),
                         episode_fn_for(tiny, ["boom", "weird"]), FakeJudges(), distill,
                         config=cfg, rng=jax.random.key(0))
  assert result.judge_failures == {"arbiter_error": 2, "arbiter_bad_value": 2}
  # both fall back to arbiter 0: every reward is the format's 0.1, nothing to learn
  assert result.history[0]["reward_mean"] == pytest.approx(0.1)
  assert result.history[0]["skipped"] == 1.0 and result.history[0]["judge_failures"] == 4.0


def test_hard_skill_gate_skips_the_update(tiny, tmp_path):
  bank = make_bank(tmp_path, evolve_window=30)
  for i in range(20):  # w = 1, n = 20: confidence 1 >= 0.98, evidence >= 20
    bank.add(f"what year was thing {i} built", "searched", True, category="time",
             modality="text-only")
  assert len(bank) == 20
  assert bank.apply_distiller_reply(BUCKET, distill(BUCKET, bank.memories(BUCKET), None),
                                    batch=bank.memories(BUCKET), strict=True).applied
  assert bank.skill_confidence(BUCKET) == 1.0
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, hard_gate=True,
                        learning_rate=LR)
  upd = tiny.updater()
  result = ttrl.run_ttrl(upd, tiny.experts, queries(2), bank, object(),
                         episode_fn_for(tiny, ["right", "wrong"]), FakeJudges(), distill,
                         config=cfg, rng=jax.random.key(0))
  record = result.history[0]
  # every episode's reward is the confidence: zero advantage, update skipped and counted
  assert record["gated_groups"] == 2.0 and record["reward_mean"] == pytest.approx(1.0)
  assert record["skipped"] == 1.0 and result.experts is tiny.experts
  # the gated batch is still judged and remembered
  assert record["memories_stored"] == 2.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(group_size=1), "TtrlConfig.group_size must be >= 2"),
    (dict(base_lambda=2.0), "TtrlConfig.base_lambda must be in"),
    (dict(steps=0), "TtrlConfig.steps must be an int >= 1"),
    (dict(micro_batches=1.5), "TtrlConfig.micro_batches must be an int >= 0"),
])
def test_config_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ttrl.TtrlConfig(**{"steps": 1, "batch_size": 1, "group_size": 2, **kwargs})


def test_ttrl_records_leave_its_micro_batches_out(tiny):
  # how TTRL's updates are split is no part of its checkpoints' identity (train_step's
  # EXECUTION_ONLY): a run resumes with more micro-batches
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR)
  meta = lambda c: ttrl._records(tiny.updater(), c, [], jax.random.key(0))[0]
  assert meta(dataclasses.replace(cfg, micro_batches=8)) == meta(cfg)


def test_judge_backends_over_the_judges_package():
  from apex_jax.judges.align import AlignJudge
  from apex_jax.judges.nogt import NoGtJudge
  from tests.apex.judges.fakes import ScriptedChat, by_role

  def backends(verdict):
    return ttrl.JudgeBackends(
        NoGtJudge(ScriptedChat(by_role("Score: 8", "Score: 7", "Score: 6", verdict))),
        AlignJudge(ScriptedChat(lambda text: "0.7")))
  skill = SKILL_REPLY["skill"]
  assert backends("A").arbiter("q", "trace", "answer") == 1.0
  assert backends("B").arbiter("q", "trace", "answer") == 0.0
  assert backends("A").alignment("plan", skill) == pytest.approx(0.7)


def flat_episodes(tiny, replan_ids=()):
  """Every episode answers 'wrong' (reward 0.1 each: flat groups, the update is skipped, nothing
  compiles) and shows `replan_ids` to its replan."""
  groups = tiny.groups("planner")

  def episode_fn(batch, contexts, generator, rng, config):
    return [[ttrl.PlannerEpisode(t, plan="search then answer", answer="wrong",
                                 workflow=f"looked up {q.question}", format_score=1.0,
                                 replan_memory_ids=tuple(replan_ids), summary="1. looked up")
             for t in groups[i]] for i, q in enumerate(batch)]
  return episode_fn


def test_replan_memories_win_rates_are_updated(tiny, tmp_path):
  bank = make_bank(tmp_path)
  ids = [bank.add(f"what year was thing {i} built", "searched", True, category="time",
                  modality="text-only").id for i in range(3)]
  ctx = bank.planner_context(queries(1)[0].question, category="time", modality="text-only")
  shown = [i for i in ids if i in ctx.memory_ids]
  extra = next(i for i in ids if i not in ctx.memory_ids)  # k = 2 of 3: one never in the plan
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR)
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(2), bank, object(),
                         flat_episodes(tiny, replan_ids=(extra, shown[0])), FakeJudges(),
                         distill, config=cfg, rng=jax.random.key(0))
  assert result.history[0]["skipped"] == 1.0
  # 4 wrong episodes each showed `extra` to their replan: usage 1 + 4, success 1 -> w = 0.2;
  # shown[0] was in both the plan and the replan: counted once per episode, not twice
  assert (bank.get(extra).usage_count, bank.get(extra).success_count) == (5, 1)
  assert bank.get(shown[0]).usage_count == 5 and bank.get(shown[1]).usage_count == 5
  # the stored memory is the Distiller's summary; the judges read the trace
  stored = [m for m in bank.memories(BUCKET) if m.id not in ids]
  assert stored and all(m.workflow_summary == "1. looked up" for m in stored)


def test_alignment_only_where_the_skill_was_shown(tiny, tmp_path):
  bank = make_bank(tmp_path)
  bank.add("what year was thing 0 built", "searched", True, category="time",
           modality="text-only")
  assert bank.apply_distiller_reply(BUCKET, distill(BUCKET, bank.memories(BUCKET), None),
                                    batch=bank.memories(BUCKET)).applied
  # w = 1, n = 1: gamma = 0.1, not > 0.1: the planner is not shown the skill
  assert bank.get_skill(BUCKET).procedure and bank.skill_confidence(BUCKET) == pytest.approx(0.1)
  assert bank.planner_context(queries(1)[0].question, category="time").skill is None
  judges = FakeJudges()
  cfg = ttrl.TtrlConfig(steps=1, batch_size=2, group_size=2, learning_rate=LR)
  result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(2), bank, object(),
                         flat_episodes(tiny), judges, distill, config=cfg,
                         rng=jax.random.key(0))
  first = result.history[0]
  # R = R_nogt = 0.9 * 0 + 0.1 * 1 (with alignment it would be (1 - 0.01) 0.1 + 0.01 * 0.5)
  assert first["reward_mean"] == pytest.approx(0.1) and judges.alignments == 0
  assert first["lambda_mean"] == 0.0 and first["unshown_skill_groups"] == 2.0


class Kill(RuntimeError):
  pass


def dies_at(call: int, fn):
  """fn, raising Kill at its `call`-th call (1-based): a run killed there."""
  calls = []

  def wrapped(*args):
    calls.append(1)
    if len(calls) == call:
      raise Kill(f"killed at call {call}")
    return fn(*args)
  return wrapped


def test_killed_ttrl_resumes_step_for_step_with_the_bank(tiny, tmp_path):
  """Killed in step 2 after the bank took its memories (in the Distiller call), restarted,
  killed again in step 3's episodes, restarted: the history, the metrics file, the experts and
  the bank's whole contents equal an unbroken run's. A restart is a new process: a new bank
  object on the (dirty) file and a new, stateless embedder."""
  from morse_jax.rl.metrics import read_jsonl
  from tests.apex.memory.fakes import HashEmbedder

  cfg = ttrl.TtrlConfig(steps=3, batch_size=2, group_size=2, learning_rate=LR)
  episodes = episode_fn_for(tiny, ["right", "boom"])  # boom: counted judge failures

  def run(root, episode_fn=episodes, distill_fn=distill, checkpoint=True):
    root.mkdir(exist_ok=True)
    bank = MemoryBank(str(root / "m.db"), HashEmbedder(64),
                      config=MemoryConfig(evolve_every=3, evolve_min_size=3))
    try:
      result = ttrl.run_ttrl(tiny.updater(), tiny.experts, queries(6), bank, object(),
                             episode_fn, FakeJudges(), distill_fn, config=cfg,
                             rng=jax.random.key(0), logdir=str(root / "logs"),
                             checkpoint_dir=str(root / "ckpt") if checkpoint else None)
      bank.export_json(str(root / "bank.json"))
      return result
    finally:
      bank.close()

  unbroken = run(tmp_path / "a", checkpoint=False)
  assert [h["evolutions_applied"] for h in unbroken.history if "evolutions_applied" in h]
  root = tmp_path / "b"
  with pytest.raises(Kill):
    run(root, distill_fn=dies_at(1, distill))  # step 2, after add_many
  with pytest.raises(Kill):
    run(root, episode_fn=dies_at(2, episodes))  # resumed at step 2; dies in step 3
  resumed = run(root)
  assert resumed.history == unbroken.history
  assert resumed.judge_failures == unbroken.judge_failures and unbroken.judge_failures
  assert read_jsonl(str(root / "logs" / "ttrl" / "metrics.jsonl")) == read_jsonl(
      str(tmp_path / "a" / "logs" / "ttrl" / "metrics.jsonl"))
  for x, y in zip(jax.tree.leaves(resumed.experts), jax.tree.leaves(unbroken.experts)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with open(root / "bank.json") as f, open(tmp_path / "a" / "bank.json") as g:
    assert json.load(f) == json.load(g)
  # a finished run restarted does nothing more and returns the same
  again = run(root, episode_fn=dies_at(1, episodes))
  assert again.history == unbroken.history
  # a damaged bank snapshot fails its sha256: the step before it is resumed from, step 3 rerun
  sidecar = root / "ckpt" / "sidecar"
  assert sorted(os.listdir(sidecar)) == ["2.db", "2.json", "3.db", "3.json"]  # keep=2
  with open(sidecar / "3.db", "r+b") as f:
    f.seek(200)
    f.write(b"\xff")
  calls = []
  rerun = run(root, episode_fn=lambda *a: calls.append(1) or episodes(*a))
  assert rerun.history == unbroken.history and len(calls) == 1
  with open(root / "bank.json") as f, open(tmp_path / "a" / "bank.json") as g:
    assert json.load(f) == json.load(g)
