"""Evaluation summaries and Sim_output against numbers worked by hand."""

import numpy as np
import pytest

from morse_jax.experiments import evaluation
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.mas.runner import NodeOutcome, TaskOutcome
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore

CHAIN = SubtaskGraph.from_obj([{"id": "1", "title": "a", "description": "", "depends_on": []},
                               {"id": "2", "title": "b", "description": "", "depends_on": ["1"]}])
ONE = SubtaskGraph.from_obj([{"id": "1", "title": "a", "description": "", "depends_on": []}])


def task(graph, scores, passed, artifacts, metrics=None):
  t = TaskOutcome(Problem("p", "f", "c", "s"), graph)
  for (node_id, (reward, ok)), text in zip(zip([n.id for n in graph.nodes], scores), artifacts):
    t.nodes[node_id] = NodeOutcome(node_id, [], "", text, NodeScore(reward, ok))
  t.score = ProblemScore(passed, metrics or {})
  return t


def test_summary_by_hand():
  tasks = [task(CHAIN, [(1.0, True), (0.5, False)], False, ["x", "y"], {"pass@1": 0.0}),
           task(ONE, [(1.0, True)], True, ["z"], {"pass@1": 1.0})]
  s = evaluation.summarize(tasks)
  assert s["step_pass"] == pytest.approx(2 / 3)  # 2 of 3 nodes
  assert s["mean_step_pass"] == pytest.approx((0.5 + 1.0) / 2)
  assert s["problem_pass"] == 0.5 and s["step_reward"] == pytest.approx(2.5 / 3)
  assert s["family/pass@1"] == 0.5
  with pytest.raises(ValueError, match="no finished tasks"):
    evaluation.summarize([])


def test_sim_output_by_hand():
  vectors = {"x": [1.0, 0.0], "y": [1.0, 1.0], "z": [0.0, 1.0]}
  embed = lambda texts: np.asarray([vectors[t] for t in texts])
  tasks = [task(CHAIN, [(1, True)] * 2, True, ["x", "y"]),   # cos 45 deg = 0.7071
           task(CHAIN, [(1, True)] * 2, True, ["x", "z"]),   # orthogonal = 0
           task(ONE, [(1, True)], True, ["z"])]              # one node: left out
  assert evaluation.heterogeneity(tasks, embed) == pytest.approx(np.sqrt(0.5) / 2)
  assert evaluation.heterogeneity(tasks[2:], embed) is None
