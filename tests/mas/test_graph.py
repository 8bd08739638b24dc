"""Subtask graphs: JSON round trip, order, and every validation error by name."""

import json

import pytest

from morse_jax.mas.graph import GraphError, SubtaskGraph, single_node

DIAMOND = [{"id": 1, "title": "parse", "description": "read input", "depends_on": []},
           {"id": 2, "title": "left", "description": "sum", "depends_on": [1]},
           {"id": 3, "title": "right", "description": "max", "depends_on": ["1"]},
           {"id": 4, "title": "join", "description": "combine", "depends_on": [2, 3]}]


def test_round_trip_order_and_waves():
  g = SubtaskGraph.from_obj({"subtasks": DIAMOND})
  assert SubtaskGraph.from_json(g.to_json()) == g
  assert g.topological_order() == ["1", "2", "3", "4"]
  assert g.waves() == [["1"], ["2", "3"], ["4"]]
  assert g.parents("4") == ("2", "3")
  reversed_input = SubtaskGraph.from_obj(list(reversed(DIAMOND)))
  assert reversed_input.topological_order() == ["1", "3", "2", "4"]
  assert single_node("do it").nodes[0].description == "do it"


def edit(index, **fields):
  nodes = json.loads(json.dumps(DIAMOND))
  nodes[index].update(fields)
  return nodes


@pytest.mark.parametrize("obj,message", [
    ([], "plan is empty"),
    (DIAMOND * 4, "16 nodes, more than the limit of 12"),
    (edit(1, id=1), "duplicate node id '1'"),
    (edit(1, depends_on=[2]), "node '2' depends on itself"),
    (edit(1, depends_on=[9]), "node '2' depends on unknown node '9'"),
    (edit(0, depends_on=[4]), r"dependency cycle: 1 -> 4 -> 2 -> 1"),
    (edit(2, title=None), r"node 2 \(id 3\): field 'title' must be a string"),
    ([{"id": 1, "title": "t"}], "node 0: missing field 'description'"),
    (edit(0, depends_on="2"), "field 'depends_on' must be a list of ids"),
    ({"steps": []}, "an object with 'subtasks'"),
    ("plan", "expected a list of nodes, got str"),
])
def test_errors_name_the_problem(obj, message):
  with pytest.raises(GraphError, match=message):
    SubtaskGraph.from_obj(obj)


def test_bad_json():
  with pytest.raises(GraphError, match="not valid JSON"):
    SubtaskGraph.from_json("{'subtasks': ")
