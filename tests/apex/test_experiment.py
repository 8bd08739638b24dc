"""apex_jax.experiment and apex_jax.pipeline: the pieces from configs/apex/demo_cpu.py, memory
building, stages, the ablation views and evaluation with a scripted generator (fast); the whole
pipeline on a tiny random Hugging Face model (slow)."""

import json
import os

import jax
import numpy as np
import pytest

from apex_jax import experiment, pipeline
from apex_jax.datasets import image_qa
from apex_jax.memory import Bucket
from apex_jax.tools import render_tool_call
from apex_jax.training.stages import STAGE_ORDER
from configs.apex import demo_cpu
from morse_jax import llm
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder
from tests.apex.training.conftest import CONFIG, Tiny

SKILL = {"operation": "synthesize", "absorbed_ids": [], "skill": {
    "skill_name": "s", "description": "d", "win_rate": 1.0, "version": 1, "evidence_count": 4,
    "procedure": [{"step": 1, "action": "search the chain", "purpose": "ground"}],
    "pitfalls": ["p"]}}


def reply(module, prompt, call):
  """A well-formed but ignorant system: plans, searches once, answers w7, never replans."""
  if module == "distiller":
    return json.dumps(SKILL) if "<|system|>" in prompt else "1. searched, answered"
  if module == "planner":
    return "<think>w20</think>w30" if prompt.count("<|assistant|>") == 1 else "no"
  if prompt.count("<|assistant|>") == 1:
    return f"<think>w9</think>{render_tool_call(['w20 w21'])}"
  return "<think>w5</think><answer>w7</answer>"


def scripted_pipeline(monkeypatch, model) -> None:
  """pipeline.run builds its experiment on `model` with the scripted `reply` (no export)."""
  def build(c, **_):
    gen = fakes.ScriptedGenerator(reply)
    gen.experts = None
    return experiment.build(c, model=model, generator=gen, embedder=HashEmbedder(64))

  monkeypatch.setattr(pipeline, "build", build)
  monkeypatch.setattr(pipeline, "export_adapters", lambda *a: {})


def small_config(workdir, **eval_overrides):
  c = demo_cpu.get_config("unused")
  c.workdir = str(workdir)
  c.data.update(entities=40, questions=24)
  for module in STAGE_ORDER:
    c.stages[module].update(batch_size=2, group_size=2)
  c.ttrl.update(batch_size=2, group_size=2)
  c.memory_build.update(questions=4, batch_size=2)
  c.eval.update(questions=3, batch_size=2, **eval_overrides)
  return c


@pytest.fixture(scope="module")
def tiny_model():
  return llm.Model(CONFIG, Tiny().backbone, fakes.tokenizer(), stop_ids=(fakes.EOS,))


@pytest.fixture
def exp(tiny_model, tmp_path):
  gen = fakes.ScriptedGenerator(reply)
  gen.experts = None  # the loops sample with copies holding the current weights
  return experiment.build(small_config(tmp_path), model=tiny_model, generator=gen,
                          embedder=HashEmbedder(64))


def test_build_memory_build_and_stages(exp):
  assert len(exp.train) == 18 and len(exp.test) == 6  # 24 questions, test fraction 0.25
  assert exp.agents.prompts == "compact" and exp.updater.lora.roles == ("planner", "executor",
                                                                        "distiller")
  stats = pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))
  assert stats["episodes"] == 4 and stats["correct"] == 0
  assert stats["memories_stored"] == len(exp.bank) == 4
  touched = {Bucket(ex.category, "text-only") for ex in exp.train[:4]}
  assert stats["evolutions_applied"] == len(touched) == stats["skills"]
  assert set(pipeline.memory_buckets(exp.bank)) == touched
  # skills are written at memory.evolve_temperature (greedy), the episodes at the agents' 1.0
  calls = list(zip(exp.generator.calls, exp.generator.temperatures))
  assert calls[-1] == (("distiller", len(touched)), 0.0)  # the evolution, last
  assert {t for (module, _), t in calls if module != "distiller"} == {1.0}
  # executor / planner episodes with memories shown; each example's own category
  assert [c for c, _ in exp.generator.calls[:2]] == ["planner", "executor"]
  stages = pipeline.stages(exp)
  assert [s.config.module for s in stages] == list(STAGE_ORDER)
  assert set(stages[1].data) == touched and stages[0].data is exp.train
  for s in stages:  # every real rollout returns batch_size groups of group_size
    groups, rewards = s.rollout_fn(s.batch(0), exp.generator, jax.random.PRNGKey(1), s.config)
    assert [len(g) for g in groups] == [2, 2] and np.shape(rewards) == (2, 2)
    assert all(t.module == s.config.module for g in groups for t in g)


def test_a_run_starts_with_an_empty_bank_unless_one_is_named(tiny_model, tmp_path):
  def build(c):
    return experiment.build(c, model=tiny_model, generator=fakes.ScriptedGenerator(reply),
                            embedder=HashEmbedder(64))

  first = build(small_config(tmp_path))
  first.bank.add("Who directed Musol?", "1. search", True, category="human")
  first.bank.close()
  assert len(build(small_config(tmp_path)).bank) == 0  # the workdir's bank: emptied
  named = small_config(tmp_path)
  named.memory.path = str(tmp_path / "kept.db")
  kept = build(named)
  kept.bank.add("Who directed Musol?", "1. search", True, category="human")
  kept.bank.close()
  assert len(build(named).bank) == 1


def test_memory_build_runs_once_per_run_and_a_restart_gets_its_bank_back(tiny_model, tmp_path):
  """A restarted run (new process: new bank object on a bank file a later phase changed)
  skips memory building: its snapshot goes back into the bank, its stats are returned."""
  from morse_jax.checkpoint.steps import CheckpointError

  def build(c):
    gen = fakes.ScriptedGenerator(reply)
    gen.experts = None
    return experiment.build(c, model=tiny_model, generator=gen, embedder=HashEmbedder(64))

  where = str(tmp_path / "checkpoints")
  first = build(small_config(tmp_path))
  stats = pipeline.resumable_memory_build(first, rng=jax.random.PRNGKey(0), directory=where)
  first.bank.export_json(str(tmp_path / "built.json"))
  first.bank.add("Who directed Musol?", "1. search", True, category="human")  # e.g. TTRL
  first.bank.close()
  again = build(small_config(tmp_path))
  assert pipeline.resumable_memory_build(again, rng=jax.random.PRNGKey(0),
                                         directory=where) == stats
  assert again.generator.calls == []  # nothing was run again
  again.bank.export_json(str(tmp_path / "restored.json"))
  with open(tmp_path / "built.json") as f, open(tmp_path / "restored.json") as g:
    assert json.load(f) == json.load(g)
  again.bank.close()
  other = small_config(tmp_path)
  other.memory_build.questions = 2
  with pytest.raises(CheckpointError, match="config memory_build differ"):
    pipeline.resumable_memory_build(build(other), rng=jax.random.PRNGKey(0), directory=where)
  assert pipeline.resumable_memory_build(build(other), rng=jax.random.PRNGKey(0),
                                         directory=where, continue_other_run=True) == stats


def test_memory_build_scores_outcomes_with_the_stages_judge(exp, monkeypatch):
  """Worked by hand: every episode answers "w7", which matches no gold (EM 0 for all four).
  The judge says A (correct) to question 0 and 3, B to question 1, and something unreadable
  to question 2, which the rule (EM) scores instead: 0, counted as a fallback. So 2 of 4
  episodes are wins, 4 judge calls, 1 fallback; the bank stores those outcomes."""
  from apex_jax.training import judging
  from tests.apex.judges.fakes import ScriptedChat

  questions = [ex.question for ex in exp.train[:4]]
  assert all(ex.answers != ["w7"] for ex in exp.train[:4])
  verdicts = dict(zip(questions, ["A", "B", "I cannot say", "A"]))
  chat = ScriptedChat(lambda prompt: next(v for q, v in verdicts.items() if q in prompt))
  monkeypatch.setattr(judging, "judge_chat", lambda exp: chat)
  exp.config.judges.update(accuracy="judge", rule="em")
  stats = pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))
  assert stats["episodes"] == 4 and stats["correct"] == 2
  assert stats["judge_calls"] == 4 and stats["judge_fallbacks"] == 1
  assert [rows for rows, _, _ in chat.calls] == [2, 2]  # one batched call per episode batch
  outcomes = {m.question: m.outcome for b in pipeline.memory_buckets(exp.bank)
              for m in exp.bank.memories(b)}
  assert outcomes == dict(zip(questions, ["correct", "incorrect", "incorrect", "correct"]))
  # the rule scorer (the demo's): EM, no judge call, both counts 0
  exp.config.judges.accuracy = "rule"
  stats = pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))
  assert stats["correct"] == 0 and stats["judge_calls"] == stats["judge_fallbacks"] == 0
  assert len(chat.calls) == 2


def test_the_outcome_scorer_is_part_of_the_memory_build_identity(tmp_path):
  c = small_config(tmp_path)  # rule "em": no key, so earlier snapshots keep their fingerprint
  assert pipeline.outcome_scorer_identity(c) is None
  c.judges.rule = "f1"
  assert pipeline.outcome_scorer_identity(c) == {"accuracy": "rule", "rule": "f1"}
  c.judges.update(accuracy="judge", rule="em")
  assert pipeline.outcome_scorer_identity(c) == {
      "accuracy": "judge", "rule": "em", "kind": "inprocess", "url": "", "model": "",
      "max_tokens": 32}


def test_procedures_enter_the_memory_build_identity_only_when_on(tmp_path):
  c = small_config(tmp_path)
  c.model.path = str(tmp_path)  # an empty folder: a fingerprint without weights
  assert "procedures" not in pipeline.memory_build_identity(c)["data"]  # earlier snapshots match
  c.data.procedures = True
  assert pipeline.memory_build_identity(c)["data"]["procedures"] is True
  train, test, passages = experiment.load_data(c)
  assert any(p.id.endswith("-records") for p in passages)
  plain_train, plain_test, _ = experiment.load_data(small_config(tmp_path))
  assert [e.question for e in train + test] == [e.question for e in plain_train + plain_test]


def test_image_questions_enter_the_memory_build_identity_only_when_on(tmp_path):
  c = small_config(tmp_path)
  c.model.path = str(tmp_path)
  assert "image_share" not in pipeline.memory_build_identity(c)["data"]
  c.data.image_share = 0.5
  assert pipeline.memory_build_identity(c)["data"]["image_share"] == 0.5
  train, test, _ = experiment.load_data(c)
  asked = [e for e in train + test if e.images]
  assert asked and all("in the image" in e.question and e.caption for e in asked)
  plain_train, plain_test, _ = experiment.load_data(small_config(tmp_path))
  assert [e.id for e in train + test] == [e.id for e in plain_train + plain_test]


def image_reply(module, prompt, call):
  """The executor calls the image search on its first turn, then answers."""
  if prompt.count("<|assistant|>") == 1:
    return ('<think>w9</think><tool_call>\n{"name": "web_image_to_image_search", '
            '"arguments": {"img_idx": "0"}}\n</tool_call>')
  return "<think>w5</think><answer>w7</answer>"


def test_world_image_questions_get_the_image_search_tool(tiny_model, tmp_path):
  """A world with image questions: the pipeline writes their cache into the workdir and its
  executor searches it (the question's entity's emblem first, 3 results); enabled False or a
  text world: no tool."""
  c = small_config(tmp_path)
  c.data.image_share = 0.5
  exp = experiment.build(c, model=tiny_model, generator=fakes.ScriptedGenerator(image_reply),
                         embedder=HashEmbedder(64))
  assert exp.image_search.root == str(tmp_path / "image_search")
  asked = [e for e in exp.test if e.images]
  [traj] = exp.executor().run([asked[0].question], rng=jax.random.PRNGKey(0),
                              **{k: v for k, v in image_qa.episode_inputs(asked[:1]).items()
                                 if k != "captions"})
  assert traj.stats["image_searches"] == 1 and traj.stats["image_search_errors"] == 0
  assert len(traj.info["images"]) == 1 + 3 and traj.answer == "w7"
  assert "1. title: The emblem of " in traj.info["turns"][0]["tool_output"]
  c.image_search.enabled = False
  assert experiment.image_searcher(c, None, asked) is None
  with pytest.raises(ValueError, match="image_search.enabled must be a bool, got 'no'"):
    experiment.image_searcher({"image_search": {"enabled": "no"}})
  assert experiment.build(small_config(tmp_path / "text"), model=tiny_model,
                          generator=fakes.ScriptedGenerator(image_reply),
                          embedder=HashEmbedder(64)).image_search is None


def test_image_switches_in_the_memory_build_identity(tmp_path):
  c = small_config(tmp_path)
  c.model.path = str(tmp_path)
  plain = pipeline.memory_build_identity(c)
  assert "image_search" not in plain and "text_image" not in plain["memory"]["bank"]
  c.memory.bank.text_image = False
  assert pipeline.memory_build_identity(c)["memory"]["bank"]["text_image"] is False
  c.data.image_share = 0.5
  assert pipeline.memory_build_identity(c)["image_search"]["enabled"] is True


def test_evolve_temperature_is_checked(exp):
  exp.config.memory.evolve_temperature = -1.0
  with pytest.raises(ValueError, match="memory.evolve_temperature must be a number >= 0"):
    pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))


def show_skills(exp, examples):
  """Six correct memories and a counted skill ('skip') per bucket of `examples`: gamma > 0.1,
  so the planner is shown the skill."""
  skip = json.dumps({**SKILL, "operation": "skip"})
  for q in examples:
    for i in range(6):
      exp.bank.add(f"{q.question} variant {i}", "worked", True, category=q.category)
  for bucket in {Bucket(q.category, "text-only") for q in examples}:
    assert exp.bank.apply_distiller_reply(bucket, skip).applied


def test_ablation_views_and_evaluate(exp):
  pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))
  q = exp.train[0]
  bucket = Bucket(q.category, "text-only")
  show_skills(exp, [q])
  full = exp.bank.planner_context(q.question, category=q.category)
  assert full.skill is not None and full.memory_ids
  no_skill = exp.bank.planner_context(q.question, category=q.category, use_skills=False)
  assert no_skill.skill is None and no_skill.gamma == 0.0 and "search the chain" not in no_skill.text
  assert no_skill.memory_ids == full.memory_ids and full.text.endswith(no_skill.text)
  no_mem = exp.bank.planner_context(q.question, category=q.category, use_memories=False)
  assert no_mem.memory_ids == () and "None found" in no_mem.text and no_mem.skill is not None
  assert no_mem.bucket == bucket and no_mem.gamma == full.gamma
  experts = {"marker": 1}
  scores = pipeline.evaluate(exp, experts, "test", use_skills=False)
  assert exp.generator.experts is None  # evaluate samples with a copy holding `experts`
  assert scores["n"] == 3 and scores["answered"] == 1.0 and scores["em"] == 0.0
  assert sum(v["n"] for v in scores["per_category"].values()) == 3
  assert scores["context_tokens"] > scores["memory_context_tokens"] > 0
  before = len(exp.bank)
  bare = pipeline.evaluate(exp, experts, "train", use_memories=False, use_skills=False)
  assert len(exp.bank) == before  # evaluation stores nothing
  assert bare["memory_context_tokens"] == 0 and bare["context_tokens"] > 0


def test_ablation_table_rows(exp, monkeypatch, tmp_path):
  """Every row, finite numbers; w/o TTRL reads the pre-TTRL snapshot, w/o iteration the one-pass
  bank; an untrained module's row has that role's initial adapter; fewer context tokens without
  memories or skills."""
  from apex_jax.training.stages import STAGE_ORDER

  one_pass = str(tmp_path / "banks" / "one_pass.db")
  stats = pipeline.memory_build(exp, rng=jax.random.PRNGKey(0), snapshot=one_pass)
  show_skills(exp, exp.test[:3])  # skills shown on the evaluated questions
  before_ttrl = exp.bank.backup(str(tmp_path / "banks" / "before_ttrl.db"))
  exp.bank.add("a question TTRL answered", "1. searched", True, category=exp.test[0].category)
  lora = exp.updater.lora
  initial = exp.experts
  staged = jax.tree.map(lambda x: x + 1.0, initial)  # every role trained by its stage
  final = pipeline.untrained_module(jax.tree.map(lambda x: x + 2.0, staged), staged, lora,
                                    "executor")  # TTRL: the planner (and the distiller, here)
  used = {}
  real = pipeline.evaluate

  def evaluate(exp_, experts, *a, **kw):
    used[len(used)] = experts
    return real(exp_, experts, *a, **kw)

  monkeypatch.setattr(pipeline, "evaluate", evaluate)
  rows = pipeline.ablations(exp, pipeline.AblationInputs(initial, staged, final, one_pass,
                                                         before_ttrl),
                            pipeline.ABLATIONS, rng=jax.random.PRNGKey(3))
  assert list(rows) == list(pipeline.ABLATIONS)
  for name, row in rows.items():
    assert row["n"] == 3 and all(np.isfinite(row[k]) for k in (
        "em", "f1", "answered", "context_tokens", "memory_context_tokens")), name
  experts_of = dict(zip(rows, used.values()))
  banks = {name: row["bank"] for name, row in rows.items()}
  assert banks["full"]["memories"] == len(exp.bank) == banks["without_ttrl"]["memories"] + 1
  assert banks["without_ttrl"]["path"] == before_ttrl and banks["full"]["path"] == "live"
  assert banks["without_iteration"] == {"path": one_pass, "memories": stats["memories_stored"],
                                        "skills": 0}  # one pass, no evolution
  assert banks["without_ttrl"]["skills"] == banks["full"]["skills"] > 0
  assert experts_of["without_ttrl"] is staged and experts_of["full"] is final
  assert experts_of["without_iteration"] is final
  for module in STAGE_ORDER:
    k = lora.role_index(module)
    for got, want, base in zip(*(jax.tree.leaves(e) for e in (
        experts_of[f"without_{module}_training"], initial, final))):
      got, want, base = map(np.asarray, (got, want, base))
      assert np.array_equal(got[:, k], want[:, k])  # that role: its adapter before its stage
      others = [j for j in range(got.shape[1]) if j != k]
      assert np.array_equal(got[:, others], base[:, others])  # the rest: the full system's
  ctx = {name: row["context_tokens"] for name, row in rows.items()}
  assert ctx["without_memories"] < ctx["full"] and ctx["without_skills"] < ctx["full"]
  assert ctx["without_memories_and_skills"] < min(ctx["without_memories"],
                                                  ctx["without_skills"])
  assert rows["without_memories_and_skills"]["memory_context_tokens"] == 0
  table = pipeline.ablation_table(rows)
  assert table.splitlines()[0].split() == ["system", "EM", "F1", "answered", "context", "E(q)",
                                           "bank"]
  assert len(table.splitlines()) == 1 + len(pipeline.ABLATIONS)
  with pytest.raises(ValueError, match="needs its bank snapshot"):
    pipeline.ablations(exp, pipeline.AblationInputs(initial, staged, final), ["without_ttrl"])
  exp.config.eval.ablations = ("full", "w/o ttrl")
  with pytest.raises(ValueError, match=r"config.eval.ablations 'w/o ttrl' not in"):
    pipeline.ablation_names(exp.config)


def test_config_judges_select_the_stage_scorers_on_one_chat(exp):
  from apex_jax.training import accuracy, judging, rollouts

  exp.config.stages.distiller.steps = 0  # its stage needs built memories; left out
  stages = {s.config.module: s.rollout_fn for s in pipeline.stages(exp)}
  # the demo: EM and the rule-based quality (the toy cannot grade)
  assert isinstance(stages["executor"].scorer, accuracy.RuleAccuracy)
  assert stages["planner"].scorer.metric == "em" and judging.skill_judge(exp) is None
  assert judging.skill_term_judges(exp) == {}  # the demo: the format / evolution rules
  exp.config.judges.update(accuracy="judge", rule="f1", skill_quality="judge",
                           skill_terms="judge")
  acc, skill = judging.reward_accuracy(exp), judging.skill_judge(exp)
  terms = judging.skill_term_judges(exp)
  assert {t: j.config.term for t, j in terms.items()} == {"format": "format",
                                                          "evolution": "evolution"}
  assert all(j.backend is skill.backend for j in terms.values())
  assert isinstance(acc, accuracy.JudgedAccuracy) and acc.fallback == "f1"
  assert acc.judge.config.max_tokens == skill.config.max_tokens == 32
  # one backend for R_acc, the skill judge and TTRL's panel
  assert acc.judge.backend is skill.backend is pipeline.judges(exp).nogt.backend
  assert isinstance(rollouts.DistillerRollout(exp.bank, exp.agents, skill).skill_judge,
                    type(skill))
  exp.config.judges.accuracy = "llm"
  with pytest.raises(ValueError, match=r"config.judges.accuracy 'llm' not in \('judge', 'rule'\)"):
    judging.reward_accuracy(exp)


def test_config_errors_name_the_field(tiny_model, tmp_path):
  c = small_config(tmp_path)
  c.search.kind = "bing"
  with pytest.raises(ValueError, match=r"config.search.kind 'bing' not in \('word', 'ngram', 'index'\)"):
    experiment.build(c, model=tiny_model, embedder=HashEmbedder())
  c = small_config(tmp_path)
  c.model.path = ""
  with pytest.raises(ValueError, match="config.model.path is empty"):
    experiment.build(c)


@pytest.mark.slow  # minutes of CPU: sampler and update compiles on a tiny random model
def test_whole_pipeline_on_a_tiny_random_model(tmp_path):
  from tests import tiny_models

  folder, _ = tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))
  c = small_config(tmp_path / "run", temperature=1.0)
  c.model.path = folder
  c.memory_build.update(questions=2, batch_size=2)
  c.agents.update(max_turns=2, max_llm_calls=3, planner_max_new_tokens=8,
                  executor_max_new_tokens=8, distiller_max_new_tokens=8, prompts="compact")
  for m in STAGE_ORDER:
    c.stages[m].update(steps=1, batch_size=1, max_new_tokens=8)
  c.ttrl.update(steps=1, batch_size=1, max_new_tokens=8)
  c.judges.max_tokens = 4
  c.eval.update(questions=2, batch_size=2)
  results = pipeline.run(c)
  with open(os.path.join(c.workdir, "results.json")) as f:
    assert json.load(f) == json.loads(json.dumps(results))
  assert [(h["module"], h["step"]) for h in results["stages"]] == [
      ("executor", 1), ("distiller", 1), ("planner", 1)]
  assert len(results["ttrl"]) == 1
  failures = results["judge_failures"]  # a random model cannot write the judges' formats
  assert set(failures) == {"evaluator", "arbiter", "align", "calls"}
  assert sum(failures["evaluator"].values()) + sum(failures["arbiter"].values()) > 0
  assert list(results["eval"]) == ["untrained", *pipeline.ABLATIONS]
  assert all(0 <= r["em"] <= 1 and r["n"] == 2 and r["context_tokens"] > 0
             for r in results["eval"].values())
  assert os.path.exists(results["eval"]["without_ttrl"]["bank"]["path"])
  for name in ("stage0_executor", "stage1_distiller", "stage2_planner", "ttrl"):
    assert os.path.exists(os.path.join(c.workdir, "logs", name, "metrics.jsonl"))
  assert results["plot"] == os.path.join(c.workdir, "rewards.png") and os.path.exists(
      results["plot"])
  for role, path in results["adapters"].items():  # each module's expert, servable by peft/vLLM
    assert os.path.exists(os.path.join(path, "adapter_model.safetensors")), role
  assert set(results["adapters"]) == {"planner", "executor", "distiller"}
  assert set(results["seconds"]) == {"memory_build", "eval_untrained", "stages", "ttrl",
                                     "ablation_ttrl", "eval"}
  assert set(results["ablation_ttrl"]) == {f"without_{m}_training" for m in STAGE_ORDER}


@pytest.mark.slow  # minutes of CPU: one update compile per stage on a tiny random model
def test_each_stage_trains_only_its_own_expert_on_real_rollouts(tmp_path):
  """Garbage output makes every reward equal (nothing to learn), so the real rollouts' rewards
  are replaced by 0 / 1 within each group: the update then has a signal, on real trajectories."""
  import dataclasses

  from apex_jax.training.stages import Stage, run_stages
  from tests import tiny_models
  from tests.apex.training.test_stages import changed

  folder, _ = tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))
  c = small_config(tmp_path / "run")
  c.model.path = folder
  c.memory_build.update(questions=2, batch_size=2)
  c.agents.update(max_turns=2, max_llm_calls=3, planner_max_new_tokens=8,
                  executor_max_new_tokens=8, distiller_max_new_tokens=8)
  for m in STAGE_ORDER:
    c.stages[m].update(batch_size=1, max_new_tokens=8, learning_rate=0.05)
  exp = experiment.build(c)
  pipeline.memory_build(exp, rng=jax.random.PRNGKey(0))
  experts = exp.experts
  for stage in pipeline.stages(exp):
    def rollout_fn(batch, generator, rng, cfg, real=stage.rollout_fn):
      groups, _ = real(batch, generator, rng, cfg)
      return groups, [[float(i % 2) for i in range(len(g))] for g in groups]
    result = run_stages(exp.updater, experts, [Stage(stage.config, stage.data, rollout_fn)],
                        exp.generator, rng=jax.random.PRNGKey(1))
    assert result.history[0]["skipped"] == 0.0
    assert changed(experts, result.experts) == {stage.config.module}
    experts = result.experts


def test_print_summary_reads_a_results_dict(capsys):
  results = {"memory_build": {"episodes": 2}, "seconds": {"stages": 1.0}, "plot": "p.png",
             "stages": [{"module": "executor", "reward_mean": r, "skipped": float(r == 0.5)}
                        for r in (0.2, 0.4, 0.5, 0.9)] + [{"module": "planner",
                                                           "reward_mean": 0.3}],
             "ttrl": [{"reward_mean": 0.1}],
             "eval": {"untrained": {"em": 0.25, "f1": 0.5, "answered": 1.0},
                      "full": {"em": 0.5, "f1": 0.75, "answered": 1.0}}}
  pipeline.print_summary(results, "/w")
  out = capsys.readouterr().out
  assert "executor   4 updates (1 skipped: flat rewards); mean reward first half 0.300, last " \
         "half 0.700" in out
  assert "planner    1 updates (0 skipped: flat rewards); mean reward 0.300" in out
  assert "ttrl       1 updates" in out
  assert "untrained                     0.250  0.500     1.000         -       -       -" in out
  assert "/w/results.json" in out


class _Killed(RuntimeError):
  pass


class _FakeChat:
  """The judges' chat backend: the same short reply to everything (the judges count it as
  unreadable and use their fallbacks)."""

  def complete(self, messages, *, max_tokens, temperature):
    return "1"


def test_a_killed_run_resumes_step_for_step(tiny_model, tmp_path, monkeypatch):
  """pipeline.run killed in the planner stage, restarted, killed in TTRL's second step,
  restarted, killed in the second step of a module row's TTRL rerun, restarted: the stages'
  and TTRL's histories (the rows' reruns too), the memory-building stats, the ablation table
  and the final bank equal an unbroken run's."""
  from apex_jax.training import judging, rollouts

  real_build = experiment.build

  def build(c, **_):
    gen = fakes.ScriptedGenerator(reply)
    gen.experts = None
    return real_build(c, model=tiny_model, generator=gen, embedder=HashEmbedder(64))

  monkeypatch.setattr(pipeline, "build", build)
  monkeypatch.setattr(judging, "judge_chat", lambda exp: _FakeChat())
  monkeypatch.setattr(pipeline, "export_adapters", lambda *a: {})
  kill = {}
  real_stages, real_episodes = pipeline.stages, rollouts.TtrlEpisodes.__call__

  def stages(exp):
    out = real_stages(exp)
    for s in out:
      def fn(batch, generator, rng, cfg, real=s.rollout_fn):
        if kill.get("stage") == cfg.module:
          raise _Killed(cfg.module)
        return real(batch, generator, rng, cfg)
      out[out.index(s)] = type(s)(s.config, s.data, _Forward(fn, s.rollout_fn))
    return out

  def episodes(self, *args):
    kill["ttrl_calls"] = kill.get("ttrl_calls", 0) + 1
    if kill.get("ttrl") == kill["ttrl_calls"]:
      raise _Killed("ttrl")
    return real_episodes(self, *args)

  monkeypatch.setattr(pipeline, "stages", stages)
  monkeypatch.setattr(rollouts.TtrlEpisodes, "__call__", episodes)

  def config(workdir):
    # one module row (its TTRL rerun resumes like TTRL's; more rows only cost time)
    c = small_config(workdir, ablations=("full", "without_ttrl", "without_iteration",
                                         "without_distiller_training"))
    for m in STAGE_ORDER:
      c.stages[m].update(steps=2)
    c.ttrl.update(steps=2)
    return c

  def comparable(results, workdir):
    # The ablation rows name the bank copies they read, under each run's own workdir.
    results = json.loads(json.dumps(results).replace(str(workdir), "<workdir>"))
    out = {k: v for k, v in results.items() if k not in ("seconds", "judge_failures", "plot")}
    out["judge_calls"] = results["judge_failures"]["calls"]  # the panel's own counts restart
    for row in out.get("ablation_ttrl", {}).values():
      row["judge_failures"] = row["judge_failures"]["calls"]
    from apex_jax.memory import MemoryBank
    b = MemoryBank(str(workdir / "memory.db"), HashEmbedder(64))  # as the run left it
    b.export_json(str(workdir / "bank.json"))
    b.close()
    with open(workdir / "bank.json") as f:
      out["bank"] = json.load(f)
    return out

  unbroken = comparable(pipeline.run(config(tmp_path / "a")), tmp_path / "a")
  workdir = tmp_path / "b"
  kill.update(stage="planner")
  with pytest.raises(_Killed):
    pipeline.run(config(workdir))
  kill.clear()
  kill.update(ttrl=2)
  with pytest.raises(_Killed):
    pipeline.run(config(workdir))
  kill.clear()
  kill.update(ttrl=3)  # TTRL's second step, then the module row's rerun: its second step
  with pytest.raises(_Killed):
    pipeline.run(config(workdir))
  kill.clear()
  resumed = pipeline.run(config(workdir))
  assert kill["ttrl_calls"] == 1  # only that row's second step ran again
  assert len(unbroken["stages"]) == 6 and len(unbroken["ttrl"]) == 2
  assert len(unbroken["bank"]["memories"]) > unbroken["memory_build"]["memories_stored"]
  resumed = comparable(resumed, workdir)
  for name, row in unbroken["ablation_ttrl"].items():
    assert resumed["ablation_ttrl"][name] == row, name
  assert resumed == unbroken


class _Forward:
  """A rollout function wrapped, with the real one's `metrics` (its judge counts) passed on."""

  def __init__(self, fn, real):
    self.fn, self.real = fn, real

  def __call__(self, *args):
    return self.fn(*args)

  @property
  def metrics(self):
    return getattr(self.real, "metrics", None)


def test_a_run_without_stages_ttrl_or_untrained_row(tiny_model, tmp_path, monkeypatch):
  """configs/apex/demo_smollm2.py's shape: every stage and TTRL at steps 0, no untrained row.
  The experts stay the initial ones; the table has only the rows asked for."""
  scripted_pipeline(monkeypatch, tiny_model)
  c = small_config(tmp_path, untrained=False, ablations=("full", "without_memories"))
  for m in STAGE_ORDER:
    c.stages[m].steps = 0
  c.ttrl.steps = 0
  results = pipeline.run(c)
  assert results["stages"] == [] and "ttrl" not in results
  assert list(results["eval"]) == ["full", "without_memories"]
  assert set(results["seconds"]) == {"memory_build", "eval"}
  assert results["memory_build"]["episodes"] == 4 and results["plot"].startswith("not drawn")


def test_the_smollm2_demo_config():
  from configs.apex import demo_smollm2

  c = demo_smollm2.get_config("/m/SmolLM2")
  assert c.model.path == "/m/SmolLM2" and c.agents.prompts == "compact"
  assert all(c.stages[m].steps == 0 for m in STAGE_ORDER) and c.ttrl.steps == 0
  assert not c.eval.untrained and c.eval.temperature == 0.0
  assert pipeline.ablation_names(c) == ("full", "without_memories", "without_skills")
  assert pipeline.outcome_scorer_identity(c) is None  # the rule (EM), as the toy's demo


def test_data_categories_keep_only_those_questions():
  from apex_jax.experiment import world_questions_of
  from apex_jax.datasets.world import World

  world = World.generate(777, 120, 60)
  kept = world_questions_of(world, ("career", "property"))
  assert kept and {e.category for e in kept} == {"career", "property"}
  assert kept == [e for e in world.examples if e.category in ("career", "property")]
  assert world_questions_of(world, ()) == list(world.examples)
  with pytest.raises(ValueError, match=r"config.data.categories: 'carrer'"):
    world_questions_of(world, ("carrer",))


def test_memory_build_temperature_sets_only_memory_buildings_agents():
  import ml_collections
  from apex_jax.agents import AgentConfig
  from apex_jax.experiment import Experiment

  def built(value):
    c = ml_collections.ConfigDict(dict(memory_build=dict(questions=2)))
    if value != "absent":
      c.memory_build.temperature = value
    return type("Built", (), {"config": c, "agents": AgentConfig(temperature=1.0),
                              "_agents_at": Experiment._agents_at})()

  assert Experiment.memory_build_agents(built("absent")).temperature == 1.0
  assert Experiment.memory_build_agents(built(None)).temperature == 1.0
  assert Experiment.memory_build_agents(built(0.0)).temperature == 0.0
  with pytest.raises(ValueError, match=r"config.memory_build.temperature .* got -1"):
    Experiment.memory_build_agents(built(-1))
  nucleus = built(0.5)
  nucleus.config.memory_build.top_p = 0.7
  agents = Experiment.memory_build_agents(nucleus)
  assert (agents.temperature, agents.top_p) == (0.5, 0.7)
  assert Experiment.memory_build_agents(built(0.5)).top_p == 1.0  # absent: the agents'
  nucleus.config.memory_build.top_p = 0.0
  with pytest.raises(ValueError, match=r"config.memory_build.top_p must be in \(0, 1\].* got 0.0"):
    Experiment.memory_build_agents(nucleus)


def test_run_uses_the_configs_compilation_cache_before_it_builds(monkeypatch):
  """pipeline.run points JAX's persistent cache at config.compilation_cache first, so that seeds
  run one after the other reuse the programs the first compiled."""
  from morse_jax import runtime  # pylint: disable=import-outside-toplevel

  calls = []

  class Built(Exception):
    pass

  def build(config):
    calls.append("build")
    raise Built

  monkeypatch.setattr(runtime, "use_compilation_cache",
                      lambda config: calls.append(config.compilation_cache))
  monkeypatch.setattr(pipeline, "build", build)
  config = demo_cpu.get_config()
  assert config.compilation_cache == "~/.cache/morse_jax/xla"
  with pytest.raises(Built):
    pipeline.run(config)
  assert calls == ["~/.cache/morse_jax/xla", "build"]


@pytest.mark.parametrize("engine", [True, False])
def test_agents_engine_switch_gives_the_generator_its_engines(tiny_model, tmp_path, engine):
  c = small_config(tmp_path)
  c.agents.update(engine=engine, engine_slots=8)
  exp = experiment.build(c, model=tiny_model, embedder=HashEmbedder(64))
  engines = exp.generator.engines
  assert (engines is not None) == engine
  if engine:
    assert (engines.slots, engines.max_len) == (8, c.agents.max_context_tokens)
