"""The planner's parsing, retries with the error shown, fallback counting, and stored plans."""

import pytest

from morse_jax.mas import planner
from morse_jax.mas.graph import GraphError
from morse_jax.tasks.base import Problem

GOOD = '{"subtasks": [{"id": 1, "title": "a", "description": "x", "depends_on": []}]}'


def test_parse_plan_finds_json_in_prose_and_fences():
  assert planner.parse_plan(f"Sure! Here it is:\n```json\n{GOOD}\n```\nDone.").nodes[0].id == "1"
  assert planner.parse_plan(f"Plan: {GOOD} hope this helps").nodes[0].title == "a"
  with pytest.raises(GraphError, match="no JSON"):
    planner.parse_plan("I cannot plan this.")
  with pytest.raises(GraphError, match="depends on unknown node '7'"):
    planner.parse_plan('[{"id": 1, "title": "a", "description": "x", "depends_on": [7]}]')


def test_retry_shows_the_error_then_falls_back_and_counts():
  problems = [Problem("p0", "t", "c", "easy"), Problem("p1", "t", "c", "hard")]
  calls = []

  def generate(batch):
    calls.append(batch)
    # p0: bad first, good on retry; p1: never valid.
    return [GOOD if len(calls) > 1 and "easy" in m[1]["content"] else "no plan" for m in batch]

  stats = planner.PlanStats()
  graphs = planner.plan(problems, generate, max_retries=2, stats=stats)
  assert [len(c) for c in calls] == [2, 2, 1]  # each round batches the failing problems
  assert "That plan is invalid: plan: the reply holds no JSON" in calls[1][0][-1]["content"]
  assert graphs[0].nodes[0].title == "a"
  assert graphs[1].nodes[0].description == "hard"  # the single-node fallback
  assert (stats.plans, stats.retries, stats.fallbacks) == (2, 3, 1)


def test_gold_graphs_and_stored_plans(tmp_path):
  gold = [{"id": "s1", "title": "a", "description": "x", "depends_on": []}]
  problems = [Problem("p0", "t", "c", "s", gold_graph=gold), Problem("p1", "t", "c", "s")]
  graphs = planner.gold_or_plan(problems, lambda batch: [GOOD] * len(batch))
  assert graphs[0].nodes[0].id == "s1" and graphs[1].nodes[0].id == "1"
  with pytest.raises(ValueError, match="'p1' has no gold graph"):
    planner.gold_or_plan(problems, None)
  path = str(tmp_path / "plans.jsonl")
  planner.save_plans(path, problems, graphs)
  assert planner.load_plans(path) == {"p0": graphs[0], "p1": graphs[1]}
  with open(path, "a") as f:
    f.write('{"problem_id": "p2", "subtasks": []}\n')
  with pytest.raises(GraphError, match=r"plans.jsonl:3: GraphError: plan is empty"):
    planner.load_plans(path)
