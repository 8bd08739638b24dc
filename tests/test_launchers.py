"""The launchers' pipelines end to end on a tiny model: train, resume, evaluate the result."""

import json
import os
import subprocess
import sys

import pytest

from configs.morse import common
from morse_jax.experiments import pipeline
from morse_jax.rl import metrics
from tests import test_configs


@pytest.mark.slow  # ~50 s; its parts are tested one by one in tests/rl and tests/mas
def test_train_resume_and_evaluate(tmp_path):
  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "scicode")
  config.model.path, config.model.dtype = folder, "float32"
  config.task.path = test_configs.DATA["scicode"]
  config.workdir = str(tmp_path / "run")
  config.lora.last_n_layers = 1
  config.router.dim = 8
  config.train.update(steps=2, tasks_per_step=1, routes_per_node=2, group_size=2,
                      max_new_tokens=4, checkpoint_every=1)
  config.eval.max_new_tokens = 4
  last = pipeline.train(config)
  assert "reward_mean" in last
  rows = metrics.read_jsonl(os.path.join(config.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows][-1] >= 2
  config.train.steps = int(rows[-1]["step"]) + 1  # one more batch after a resume
  pipeline.train(config)
  rows = metrics.read_jsonl(os.path.join(config.workdir, "metrics.jsonl"))
  assert sorted({r["step"] for r in rows}) == list(range(1, len(rows) + 1))
  summary = pipeline.evaluate(config, checkpoint=os.path.join(config.workdir, "ckpt"),
                              split="train")
  assert 0.0 <= summary["step_pass"] <= 1.0 and summary["tasks"] >= 1
  json.dumps(summary)


@pytest.mark.slow
def test_evaluate_launcher_writes_records(tmp_path):
  """launchers.evaluate (a process of its own: absl flags) on two HumanEval problems with a tiny
  random model: the summary, and per node and per problem a record that says why it failed."""
  folder = test_configs.tiny_models.save_hf_model(
      "qwen3", str(tmp_path / "model"), max_position_embeddings=1024)[0]  # prompts of 282 tokens
  workdir = tmp_path / "run"
  args = ["--config=configs/morse/humaneval.py:single,qwen3_4b,cpu",
          f"--config.model.path={folder}", "--config.model.dtype=float32",
          "--config.task.limit=2", "--config.eval.max_new_tokens=4",
          "--config.eval.tasks_per_batch=1",  # two batches: records written after each
          f"--config.workdir={workdir}", "--config.compilation_cache=", "--split=all",
          "--record_prompts"]
  done = subprocess.run([sys.executable, "-m", "launchers.evaluate", *args], cwd=test_configs.ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "1/2 problems run, 0 passed" in done.stdout and "2/2 problems run" in done.stdout
  summary = json.loads((workdir / "eval_all.json").read_text())
  assert summary["tasks"] == 2 and summary["records"] == str(workdir / "eval_all.jsonl")
  lines = [json.loads(line) for line in (workdir / "eval_all.jsonl").read_text().splitlines()]
  assert [(r["kind"], r["problem_id"]) for r in lines] == [
      ("node", "HumanEval/0"), ("problem", "HumanEval/0"), ("node", "HumanEval/1"),
      ("problem", "HumanEval/1")]
  for node, problem in (lines[:2], lines[2:]):
    assert 1 <= node["generated_tokens"] <= 4 and node["route"] == []
    # The tiny tokenizer is word-level: the prompt's words are its tokens.
    assert node["prompt_tokens"] == len(node["prompt"].split()) > 100
    assert not node["passed"] and node["reason"] and node["code"] == node["reply"]
    assert (problem["passed"], problem["steps_passed"], problem["steps"]) == (False, 0, 1)


def test_plan_stores_graphs_that_runs_read(tmp_path):
  """SRDD has no gold graphs: the (tiny, random) planner's replies fail to parse, every problem
  falls back to one node, and the stored plans are read back by a run's config."""
  from morse_jax.experiments import experiment
  from morse_jax.mas import planner

  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = common.apply(common.base(), "morse_base,qwen3_4b,cpu", "srdd")
  config.model.path, config.model.dtype = folder, "float32"
  config.task.path, config.task.limit = test_configs.DATA["srdd"], 2
  config.task.holdout = 2  # the fixture has 5 categories (the real SRDD 40, 8 held out)
  config.planner_max_new_tokens = 4
  out = str(tmp_path / "plans.jsonl")
  stats = pipeline.plan(config, out, split="train")
  assert stats["problems"] == 2 and stats["fallbacks"] == 2 and stats["retries"] == 4
  config.task.plans = out
  exp = experiment.build(config)
  problems = experiment.split(config, exp.problems, "train")
  assert exp.graphs(problems) == list(planner.load_plans(out).values())


def _demo_config(tmp_path):
  from configs.morse import demo_cpu

  config = demo_cpu.get_config()
  config.workdir = str(tmp_path / "demo")
  config.compilation_cache = ""
  return config


def test_demo_refuses_a_before_measured_on_other_settings(tmp_path):
  config = _demo_config(tmp_path)
  earlier = tmp_path / "demo.json"
  identity = pipeline.before_identity(config)
  assert json.loads(json.dumps(identity)) == identity  # survives demo.json (tuples -> lists)
  earlier.write_text(json.dumps({"before": {"step_pass": 0.5},
                                 "before_identity": dict(identity, model="/other/model")}))
  config.eval.before = str(earlier)
  with pytest.raises(ValueError, match="was measured on other settings"):
    pipeline.demo(config)


@pytest.mark.slow  # ~2 min: the whole demo on a tiny random model
def test_demo_end_to_end_and_reuse_of_before(tmp_path):
  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = _demo_config(tmp_path)
  config.model.path = folder
  config.task.update(num_problems=60, test_problems=2)
  config.train.update(steps=1, max_new_tokens=8)
  config.eval.max_new_tokens = 8
  summary = pipeline.demo(config)
  assert summary["steps"] >= 1 and set(summary["before"]) >= {"step_pass", "problem_pass"}
  for name in ("demo.json", "metrics.jsonl", "step_reward.png", "eval_test_before.jsonl",
               "eval_test_after.jsonl"):
    assert os.path.exists(os.path.join(config.workdir, name))
  config.eval.before = os.path.join(config.workdir, "demo.json")
  config.workdir = str(tmp_path / "demo2")
  again = pipeline.demo(config)
  assert again["before"] == summary["before"]
  assert sorted(n for n in os.listdir(config.workdir) if n.startswith("eval_")) == [
      "eval_test_after.jsonl"]  # the reused measurement's records stay where it was made
  with open(os.path.join(config.workdir, "demo.json")) as f:  # and the run says where
    assert json.load(f)["before_records"] == os.path.join(str(tmp_path / "demo"),
                                                          "eval_test_before.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_runs_on_the_engine_with_the_static_samplers_tokens(temperature):
  """launchers.generate's one-device path is the engine: its rows are `llm.sample`'s (greedy,
  and sampled: row i draws with fold_in(rng, i) on both)."""
  import jax
  import numpy as np

  from launchers import generate_lib as generate
  from morse_jax import llm
  from morse_jax.llm import sharding

  model = generate.tiny_random_model()
  rows = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [5, 6, 7]]
  settings = llm.GenerationSettings.for_model(
      model, 12, llm.SamplingConfig(temperature=temperature))
  run = generate.sampler(model, rows, settings, sharding.make_mesh(1, 1))
  got = run(jax.random.key(3))
  want = llm.sample(model, rows, settings, rng=jax.random.key(3))
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_array_equal(got.tokens, want.tokens)
