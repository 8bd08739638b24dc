"""benchmarks.rl_compare: before / after numbers and reward-curve halves of training runs."""

import json
import os

import pytest

from benchmarks import rl_compare


def _run(folder, rewards, demo=None):
  os.makedirs(folder)
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    for step, r in enumerate(rewards, 1):
      f.write(json.dumps({"step": step, "reward_mean": r, "skipped": float(r == 0.0),
                          "time_rollout_s": 2.0, "time_update_s": 1.0}) + "\n")
  if demo:
    with open(os.path.join(folder, "demo.json"), "w") as f:
      json.dump(demo, f)
  return str(folder)


def test_compare_halves_held_out_and_copies(tmp_path):
  done = {"before": {"step_pass": 0.25, "problem_pass": 0.25, "step_reward": 0.3},
          "after": {"step_pass": 0.375, "problem_pass": 0.375, "step_reward": 0.4}}
  runs = {"mole_hgrpo": _run(tmp_path / "h", [0.0, 0.5, 0.25, 1.0], done),
          "fixed_grpo": _run(tmp_path / "f", [0.1, 0.2, 0.6])}
  summary = rl_compare.compare(runs, str(tmp_path / "out"))
  h, f = summary["mole_hgrpo"], summary["fixed_grpo"]
  assert h["reward_first_half"] == pytest.approx(0.25)  # (0 + 0.5) / 2
  assert h["reward_last_half"] == pytest.approx(0.625)  # (0.25 + 1) / 2
  assert (h["updates"], h["skipped_updates"], h["rollout_s"], h["update_s"]) == (4, 1, 8.0, 4.0)
  assert (h["before_step_pass"], h["after_step_pass"]) == (0.25, 0.375)
  assert f["reward_first_half"] == pytest.approx(0.1)  # 3 updates: 1 and 2
  assert f["reward_last_half"] == pytest.approx(0.4)
  assert "before_step_pass" not in f  # not finished: no demo.json
  assert os.path.getsize(tmp_path / "out" / "reward_curves.png") > 0
  assert os.path.exists(tmp_path / "out" / "mole_hgrpo" / "demo.json")
  with open(tmp_path / "out" / "summary.json") as fh:
    assert json.load(fh) == summary


def test_bad_runs_are_named(tmp_path):
  with pytest.raises(ValueError, match="'hgrpo' is not name=folder"):
    rl_compare.parse_runs("hgrpo")
  assert rl_compare.parse_runs("a=/x,b=/y") == {"a": "/x", "b": "/y"}
  empty = _run(tmp_path / "e", [])
  with pytest.raises(ValueError, match="has no updates"):
    rl_compare.summarize(empty)


def _records(folder, passed):
  with open(os.path.join(folder, "eval_test_" + passed[0] + ".jsonl"), "w") as f:
    for i, ok in enumerate(passed[1]):
      f.write(json.dumps({"kind": "node", "problem_id": f"p{i}", "node_id": "1",
                          "passed": ok}) + "\n")
      f.write(json.dumps({"kind": "problem", "problem_id": f"p{i}", "passed": ok,
                          "steps_passed": int(ok), "steps": 1}) + "\n")


def test_paired_tests_count_the_nodes_that_changed(tmp_path):
  h, f = _run(tmp_path / "h", [0.5]), _run(tmp_path / "f", [0.5])
  for folder, before, after in ((h, [0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 0]),
                                (f, [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1])):
    _records(folder, ("before", [bool(x) for x in before]))
    _records(folder, ("after", [bool(x) for x in after]))
  tests = rl_compare.paired_tests({"hgrpo": h, "fixed": f})
  gain = tests["hgrpo after - before"]
  assert (gain["nodes"], gain["better"], gain["worse"]) == (6, 4, 1)
  assert gain["mean_difference"] == pytest.approx(3 / 6)
  assert gain["p_value"] == pytest.approx(12 / 32)  # |sum| >= 3 in 12 of the 2^5 sign flips
  assert tests["fixed after - before"]["p_value"] == 1.0  # nothing changed
  assert (tests["fixed - hgrpo after"]["better"], tests["fixed - hgrpo after"]["worse"]) == (1, 4)
  _records(f, ("after", [False] * 5))
  with pytest.raises(ValueError, match="different nodes"):
    rl_compare.paired_tests({"hgrpo": h, "fixed": f})


def test_a_run_that_reused_the_untrained_measurement_pairs_with_its_records(tmp_path):
  h = _run(tmp_path / "h", [0.5])
  _records(h, ("before", [False, False, True]))
  f = _run(tmp_path / "f", [0.5], {"before": {}, "after": {},
                                   "before_records": os.path.join(h, "eval_test_before.jsonl")})
  _records(f, ("after", [True, True, True]))
  gain = rl_compare.paired_tests({"fixed": f})["fixed after - before"]
  assert (gain["nodes"], gain["better"], gain["worse"]) == (3, 2, 0)
  alone = _run(tmp_path / "alone", [0.5], {"before": {}, "after": {}})
  _records(alone, ("after", [True]))
  assert rl_compare.paired_tests({"alone": alone}) == {}  # no before anywhere: no test
