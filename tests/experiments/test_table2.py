"""Table 2's statistics by hand, and the whole command on a tiny model (slow)."""

import json
import os

import ml_collections
import numpy as np
import pytest

from morse_jax.experiments import table2


def test_sign_flip_test_by_hand():
  # Five nodes all better by 1: of the 32 sign patterns only all-plus and all-minus reach |5|.
  assert table2.sign_flip_test([1, 1, 1, 1, 1]) == pytest.approx(2 / 32)
  # Zeros carry no sign: the same five and three ties give the same p-value.
  assert table2.sign_flip_test([1, 1, 1, 1, 1, 0, 0, 0]) == pytest.approx(2 / 32)
  # [1, 1, -1]: |sum| = 1; the patterns reaching |sum| >= 1 are all 8 (sums are odd).
  assert table2.sign_flip_test([1, 1, -1]) == pytest.approx(1.0)
  # [2, 1]: sums 3, 1, -1, -3; |sum| >= 3 for 2 of 4.
  assert table2.sign_flip_test([2, 1]) == pytest.approx(0.5)
  assert table2.sign_flip_test([0, 0]) == 1.0
  # More than 16 non-zero differences: random flips, close to the exact two-sided value.
  p = table2.sign_flip_test([1.0] * 10 + [-1.0] * 2 + [0.5] * 8)
  assert 0.0 < p < 0.05


def test_mcnemar_exact_by_hand():
  # 5 discordant, all one way: 2 * (1 / 32).
  assert table2.mcnemar_exact(5, 0) == pytest.approx(2 / 32)
  assert table2.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
  # 1 against 3: 2 * (C(4,0) + C(4,1)) / 16 = 10 / 16.
  assert table2.mcnemar_exact(1, 3) == pytest.approx(10 / 16)
  # A tie's doubled tail passes 1 and is capped; no discordant pair says nothing.
  assert table2.mcnemar_exact(2, 2) == 1.0
  assert table2.mcnemar_exact(0, 0) == 1.0
  # On 0 / 1 differences it is the exact sign-flip test.
  assert table2.mcnemar_exact(7, 2) == pytest.approx(table2.sign_flip_test([1] * 7 + [-1] * 2))


@pytest.mark.parametrize("a_only, b_only", [(-1, 2), (1.5, 2), (True, 2), (1, "2")])
def test_mcnemar_exact_refuses_what_is_not_a_count(a_only, b_only):
  with pytest.raises(ValueError, match="must be a count"):
    table2.mcnemar_exact(a_only, b_only)


def _run(variant, seed, nodes, problems, steps=None):
  steps = steps or {k: float(v) for k, v in problems.items()}
  return {"variant": variant, "seed": seed, "updates": 0 if seed is None else 10,
          "summary": {"step_pass": float(np.mean(list(nodes.values()))),
                      "family_step_pass": float(np.mean(list(steps.values()))),
                      "problem_pass": float(np.mean(list(problems.values())))},
          "nodes": nodes, "problems": problems, "problem_steps": steps}


def test_summarize_means_spreads_and_paired_tests():
  base = _run("morse_base", None, {"p1/a": 0.0, "p1/b": 0.0, "p2/a": 1.0}, {"p1": 0, "p2": 1})
  single = _run("single", None, {"p1/whole": 0.0, "p2/whole": 0.0}, {"p1": 0, "p2": 0},
                {"p1": 0.5, "p2": 0.25})
  seeds = [_run("mole_hgrpo", 0, {"p1/a": 1.0, "p1/b": 0.0, "p2/a": 1.0}, {"p1": 0, "p2": 1}),
           _run("mole_hgrpo", 1, {"p1/a": 1.0, "p1/b": 1.0, "p2/a": 1.0}, {"p1": 1, "p2": 1})]
  out = table2.summarize([base, single] + seeds,
                         [("mole_hgrpo", "morse_base"), ("morse_base", "single")])
  row = out["rows"]["mole_hgrpo"]
  assert row["step_pass"]["mean"] == pytest.approx((2 / 3 + 1) / 2)
  assert row["step_pass"]["std"] == pytest.approx(np.std([2 / 3, 1.0], ddof=1))
  assert row["problem_pass"]["runs"] == [0.5, 1.0]
  assert out["rows"]["morse_base"]["step_pass"]["std"] == 0.0
  tests = {(t["a"], t["b"], t["unit"]): t for t in out["tests"]}
  nodes = tests[("mole_hgrpo", "morse_base", "nodes")]
  # per-node seed means minus base: p1/a 1 - 0, p1/b 0.5 - 0, p2/a 1 - 1
  assert nodes["mean_difference"] == pytest.approx(1.5 / 3)
  assert (nodes["a_better"], nodes["b_better"], nodes["paired"]) == (2, 0, 3)
  assert nodes["p_value"] == pytest.approx(table2.sign_flip_test([1.0, 0.5, 0.0]))
  # single's nodes are whole problems: only its problems pair with MoRSE's
  assert ("morse_base", "single", "nodes") not in tests
  assert tests[("morse_base", "single", "problems")]["mean_difference"] == pytest.approx(0.5)
  # the family's step pass per problem pairs them too: (0 - 0.5 + 1 - 0.25) / 2
  family = tests[("morse_base", "single", "problem_steps")]
  assert family["mean_difference"] == pytest.approx(0.125)
  assert (family["a_better"], family["b_better"]) == (1, 1)
  assert out["rows"]["single"]["family_step_pass"]["mean"] == pytest.approx(0.375)


def test_summarize_refuses_runs_on_other_problems():
  a = _run("mole_grpo", 0, {"p1/a": 1.0}, {"p1": 1})
  b = _run("mole_grpo", 1, {"p9/a": 1.0}, {"p9": 1})
  with pytest.raises(ValueError, match="evaluated other"):
    table2.summarize([a, b], [])


def test_passes_reads_the_evaluation_records(tmp_path):
  path = tmp_path / "eval_test.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in [
      {"kind": "node", "problem_id": "t1", "node_id": "n1", "passed": True},
      {"kind": "node", "problem_id": "t1", "node_id": "n2", "passed": False},
      {"kind": "problem", "problem_id": "t1", "passed": False},
      {"kind": "node", "problem_id": "t2", "node_id": "n1", "passed": True},
      {"kind": "problem", "problem_id": "t2", "passed": True,
       "metrics": {"step_pass": 0.75}}]) + "\n")
  assert table2.passes(str(path)) == {"nodes": {"t1/n1": 1.0, "t1/n2": 0.0, "t2/n1": 1.0},
                                      "problems": {"t1": 0.0, "t2": 1.0},
                                      "problem_steps": {"t1": 0.0, "t2": 0.75}}
  (tmp_path / "empty.jsonl").write_text("")
  with pytest.raises(ValueError, match="no problem records"):
    table2.passes(str(tmp_path / "empty.jsonl"))


def test_finished_runs_are_reused_from_their_records(tmp_path, monkeypatch):
  workdir = tmp_path / "mole_hgrpo" / "seed1"
  workdir.mkdir(parents=True)
  records = workdir / "eval_test.jsonl"
  records.write_text("\n".join(json.dumps(r) for r in [
      {"kind": "node", "problem_id": "t1", "node_id": "n1", "passed": True, "reward": 1.0},
      {"kind": "node", "problem_id": "t1", "node_id": "n2", "passed": False, "reward": 0.5},
      {"kind": "node", "problem_id": "t2", "node_id": "n1", "passed": False, "reward": 0.0},
      {"kind": "problem", "problem_id": "t1", "passed": False, "metrics": {"step_pass": 0.5}},
      {"kind": "problem", "problem_id": "t2", "passed": False,
       "metrics": {"step_pass": 0.0}}]) + "\n")
  run = table2.finish("mole_hgrpo", 1, 60, str(workdir), str(records))
  assert run["summary"] == pytest.approx({"step_pass": 1 / 3, "mean_step_pass": 0.25,
                                          "problem_pass": 0.0, "family_step_pass": 0.25,
                                          "step_reward": 0.5})
  from morse_jax.experiments import pipeline

  def train(config):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(pipeline, "train", train)
  config = ml_collections.ConfigDict({"seed": 0, "table2": {"steps": 60}})
  assert table2._one_run(config, "mole_hgrpo", 1, str(tmp_path)) == run


def test_baselines_run_untrained_and_pair_over_problems(tmp_path, monkeypatch):
  from configs.morse import common
  from morse_jax.experiments import pipeline

  passed = {"morse": (True, False), "chatchain": (False, False)}  # by system, problems t1, t2

  def evaluate(config, checkpoint, split, name):
    assert checkpoint is None and config.train.steps == 0
    path = os.path.join(config.workdir, f"{name}.jsonl")
    os.makedirs(config.workdir, exist_ok=True)
    with open(path, "w") as f:
      for problem, ok in zip(("t1", "t2"), passed[config.system]):
        f.write(json.dumps({"kind": "node", "problem_id": problem, "node_id": "1",
                            "passed": ok, "reward": float(ok)}) + "\n")
        f.write(json.dumps({"kind": "problem", "problem_id": problem, "passed": ok}) + "\n")
    return {"records": path}

  monkeypatch.setattr(pipeline, "evaluate", evaluate)
  config = common.apply(common.base(), "morse_base,qwen25_coder_15b,cpu", "humaneval")
  config.workdir = str(tmp_path)
  config.table2 = ml_collections.ConfigDict(dict(
      variants=("morse_base", "chatchain"), seeds=(0,), steps=0,
      comparisons=(("chatchain", "morse_base"),)))
  result = table2.run(config)
  assert result["rows"]["chatchain"]["seeds"] == [None]  # one seed-free measurement
  tests = {(t["a"], t["b"], t["unit"]): t for t in result["tests"]}
  assert tests[("chatchain", "morse_base", "problems")]["mean_difference"] == -0.5


@pytest.mark.slow  # ~3 min: five systems, two seeds, one update each, on a tiny random model
def test_table2_end_to_end_on_a_tiny_model(tmp_path):
  from configs.morse import table2_cpu
  from tests import tiny_models

  folder = tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = table2_cpu.get_config()
  config.model.path, config.workdir = folder, str(tmp_path / "t2")
  config.task.update(num_problems=60, test_problems=2)
  config.train.update(max_new_tokens=8, checkpoint_every=1)
  config.eval.max_new_tokens = 8
  config.planner_max_new_tokens = 8
  config.table2.update(seeds=(0, 1), steps=1)
  result = table2.run(config)
  assert set(result["rows"]) == set(config.table2.variants)
  for variant in table2.TRAINED:
    assert len(result["rows"][variant]["seeds"]) == 2
    assert all(u >= 1 for u in result["rows"][variant]["updates"])
  assert {(t["a"], t["b"]) for t in result["tests"]} == {tuple(c) for c in
                                                          config.table2.comparisons}
  assert os.path.exists(os.path.join(config.workdir, "table2.json"))
  assert os.path.getsize(os.path.join(config.workdir, "table2_rewards.png")) > 1000
  assert os.path.exists(os.path.join(config.workdir, "mole_hgrpo", "seed1", "eval_test.jsonl"))
