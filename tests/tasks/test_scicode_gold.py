"""SciCode targets computed from the dev problems' gold code in the sandbox, their cache, the
refusal without them, and the gold code through the verifier (canonical) on real problems."""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np
import pytest

from configs.morse import scicode_canonical
from morse_jax.experiments import pipeline
from morse_jax.tasks import scicode, scicode_gold


@pytest.fixture(scope="module")
def problems():
  return {p.id: p for p in scicode.load()}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
  return scicode.SciCode(targets_cache=str(tmp_path_factory.mktemp("targets")))


@pytest.mark.parametrize("test, want", [
    ("x = 1\nassert np.allclose(f(x), target)\ny = x", "x = 1\n__target__ = f(x)\ny = x\n"),
    ("assert cmp(target, g(1), atol=1)", "__target__ = g(1)\n"),
    ("assert (a > 0) == target", "__target__ = a > 0\n"),
    ("assert np.allclose(d(c)[0], target[0]) and np.allclose(d(c)[1], target[1])",
     "__target__ = d(c)\n"),
    ("assert np.isclose(b[0], 1).any() == target.any()", "__target__ = np.isclose(b[0], 1)\n"),
    ("def f():\n    return 1\nassert f() == 1", None),
])
def test_recording_snippets(test, want):
  assert scicode_gold.recording_snippet(test) == want


@pytest.mark.parametrize("test, error", [
    ("a, b = target", "used in a Assign statement"),
    ("assert target > f(1)", "not as one side of a comparison"),
    ("assert np.allclose(f(1), target[0])", "does not apply the same accessors"),
    ("assert f(1) == target and g(2) == target", "stand against different expressions"),
    ("assert f(1) == target\nassert g(2) == target", "stand against different expressions"),
])
def test_unreadable_uses_of_target_are_named(test, error):
  with pytest.raises(scicode_gold.GoldTargetsError, match=error):
    scicode_gold.recording_snippet(test)


def test_targets_of_a_dev_step_by_hand(problems):
  p = problems["29"]  # Gram-Schmidt: normalize, inner_product, orthogonalize
  products = scicode_gold.compute(p, "29.2")
  assert products == [24, 25, 86]  # 3*4+4*3, 3*3+4*4, 3*4+4*3+7*2+6*8
  assert all(type(v) is np.int64 for v in products)
  first = scicode_gold.compute(p, "29.1")[0]  # normalize([3, 4])
  assert first.dtype == np.float64 and first.tolist() == [0.6, 0.8]
  with pytest.raises(scicode_gold.GoldTargetsError, match=r"problem 2 step 2\.1: .*no "
                     r"ground_truth_code"):
    scicode_gold.compute(problems["2"], "2.1")


def test_cache_round_trip(problems, tmp_path, monkeypatch):
  p = problems["29"]
  store = scicode_gold.GoldTargets(str(tmp_path))
  computed = store.targets(p, "29.3")
  path = store.path(p, "29.3")
  assert os.path.exists(path) and os.path.basename(path).startswith("29-29.3-")
  assert computed[0] is np.True_ and computed[1].shape == (3, 3)

  def no_sandbox(*args, **kwargs):
    raise AssertionError("computed again instead of read from the cache")

  monkeypatch.setattr(scicode_gold, "compute", no_sandbox)
  again = scicode_gold.GoldTargets(str(tmp_path)).targets(p, "29.3")
  assert type(again[0]) is type(computed[0]) and again[0] == computed[0]
  for a, b in zip(again[1:], computed[1:]):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  # A changed test case is another key, so another file: a stale entry is never read.
  steps = [dict(s) for s in p.data["sub_steps"]]
  steps[2]["test_cases"] = steps[2]["test_cases"][1:]
  changed = dataclasses.replace(p, data=dict(p.data, sub_steps=steps))
  assert store.path(changed, "29.3") != path
  # An unreadable file is computed again (with a warning), then rewritten.
  with open(path, "wb") as f:
    f.write(b"not gzip")
  monkeypatch.setattr(scicode_gold, "compute", lambda *a, **k: ["fresh"] * 4)
  assert scicode_gold.GoldTargets(str(tmp_path)).targets(p, "29.3") == ["fresh"] * 4
  with gzip.open(path, "rt") as f:
    assert "fresh" in f.read()


def test_steps_without_targets_are_refused(problems, family):
  p = problems["2"]  # problems_all.jsonl: no gold code, and no targets_h5 given
  reply = "```python\ndef simulate_gaussian_beam():\n    return 1\n```"
  with pytest.raises(scicode.MissingTargetsError) as e:
    family.score_node(p, p.gold_graph[0], reply, {})
  message = str(e.value)
  assert "problem 2 step 2.1" in message and "targets_h5" in message
  assert "ground_truth_code" in message and "problems_dev.jsonl" in message
  whole = {"id": "1", "title": "Solve the task", "description": "", "depends_on": []}
  with pytest.raises(scicode.MissingTargetsError, match=r"problem 2 step 2\.1"):
    family.score_node(p, whole, "no code at all", {})  # a setup error, whatever the reply
  # Runs check every problem first (pipeline.train / evaluate call this after the split).
  family.check_targets([problems["29"], problems["10"]])
  with pytest.raises(scicode.MissingTargetsError, match=r"1 steps .*\(2\.1\): give .*targets_h5"):
    family.check_targets([problems["29"], p])
  scicode.SciCode(targets_h5="/given/test_data.h5").check_targets([p])  # read when scored


def test_gold_code_passes_and_wrong_code_fails(problems, family):
  p = problems["29"]
  scores = pipeline.canonical_scicode_problem(family, p)
  assert [(n, s.passed, s.details["tests"]) for n, s in scores] == [
      ("29.1", True, 3), ("29.2", True, 3), ("29.3", True, 4)]
  wrong = "```python\ndef inner_product(u, v):\n    return u.T @ v + 1\n```"
  upstream = {"29.1": scicode.gold_artifact(p, "29.1")}
  score = family.score_node(p, p.gold_graph[1], wrong, upstream)
  assert (score.reward, score.passed) == (0.0, False)


def test_one_reply_for_the_whole_problem(problems, family):
  """The `single` system's node (id "1" is no step of problem 29) is run against every step."""
  p = problems["29"]
  gold = "\n\n".join(s["ground_truth_code"] for s in p.data["sub_steps"])
  node = {"id": "1", "title": "Solve the task", "description": p.statement, "depends_on": []}
  assert all(s["function_header"].split("(")[0] in family.executor_instructions(p, node)
             for s in p.data["sub_steps"])
  full = family.score_node(p, node, f"```python\n{gold}\n```", {})
  assert (full.reward, full.passed, full.details["steps_passed"]) == (1.0, True, 3)
  broken = gold.replace("p = (u.T @ v)", "p = (u.T @ v) + 1")
  assert broken != gold
  part = family.score_node(p, node, f"```python\n{broken}\n```", {})
  # inner_product is wrong, and orthogonalize uses it: only normalize passes.
  assert part.reward == pytest.approx(1 / 3) and "step 29.2" in part.details["reason"]
  metrics = family.score_problem(p, {"1": f"```python\n{broken}\n```"}).metrics
  assert (metrics["steps_passed"], metrics["steps"], metrics["problem_pass"]) == (1.0, 3.0, 0.0)


@pytest.mark.slow  # every dev step: ~5 min on 2 busy cores with no cache, ~2 min cached
def test_canonical_passes_every_dev_step(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))  # a fresh target cache: computed, then used
  summary = pipeline.canonical(scicode_canonical.get_config())
  assert (summary["problems"], summary["steps"]) == (15, 50)
  assert summary["passed"] == 50, summary["failed"]
