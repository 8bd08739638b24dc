"""SciCode in the official layout: loading, errors, graphs, node scores, metrics and splits."""

from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pytest

from morse_jax.mas.agents import Reply
from morse_jax.tasks import scicode
from morse_jax.tasks.base import ProblemScore

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "scicode_mini.json")


def _fence(code: str) -> str:
  return f"Here it is.\n```python\n{code}```\n"


VELOCITY = _fence("def velocity(v0, g, t):\n    v = v0 - g * t\n    return v\n")
MAX_HEIGHT = _fence("def max_height(v0, g):\n    h = v0 ** 2 / (2 * g)\n    return h\n")
# Right only for v0 = 0 (the second test): passes half of the tests.
HALF_RIGHT = _fence("def max_height(v0, g):\n    return v0 / g\n")
STUB = _fence("def max_height(v0, g):\n    '''Later.'''\n    pass\n")
# Uses step 1.1's function, so it passes only when the upstream code is prepended.
VIA_UPSTREAM = _fence("def max_height(v0, g):\n    t = v0 / g\n"
                      "    return v0 * t - 0.5 * g * t ** 2 + 0 * velocity(v0, g, t)\n")


@pytest.fixture(scope="module")
def problems():
  return scicode.load(FIXTURE)


def _raw():
  with open(FIXTURE) as f:
    return json.load(f)


def test_load(problems):
  assert [p.id for p in problems] == ["1", "2", "3"]
  assert [p.category for p in problems] == ["Physics", "Chemistry", "Mathematics"]
  p = problems[0]
  assert p.family == "scicode" and "thrown straight up" in p.statement
  assert p.data["required_dependencies"] == "import numpy as np"
  assert [s["step_number"] for s in p.data["sub_steps"]] == ["1.1", "1.2"]


def test_jsonl_and_category_mapping(tmp_path, problems):
  raw = _raw()
  del raw[2]["category"]
  path = tmp_path / "mini.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in raw) + "\n\n")
  loaded = scicode.load(str(path))
  assert [p.gold_graph for p in loaded] == [p.gold_graph for p in problems]
  assert loaded[2].category == "unknown"
  mapping = tmp_path / "categories.json"
  mapping.write_text(json.dumps({"3": "Biology", "1": "Math"}))
  assert [p.category for p in scicode.load(str(path), str(mapping))] == [
      "Math", "Chemistry", "Biology"]


@pytest.mark.parametrize("edit, pattern", [
    (lambda r: r[1]["sub_steps"][0].pop("test_cases"),
     r"problem 1: sub_steps\[0\]: field 'test_cases' is missing"),
    (lambda r: r[0].update(sub_steps="oops"), r"problem 0: field 'sub_steps' is a str"),
    (lambda r: r[2].pop("problem_id"), r"problem 2: field 'problem_id' is missing"),
    (lambda r: r[0]["sub_steps"][1].update(step_number="1.1"),
     r"problem 0: sub_steps\[1\]: field 'step_number' '1.1' is repeated"),
    (lambda r: r[0]["sub_steps"][0].update(test_cases=[1]),
     r"problem 0: sub_steps\[0\]: field 'test_cases' must be a list of strings"),
])
def test_malformed_json_names_file_index_and_field(tmp_path, edit, pattern):
  raw = _raw()
  edit(raw)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(raw))
  with pytest.raises(ValueError, match=r"bad\.json: " + pattern):
    scicode.load(str(path))


def test_malformed_jsonl_names_the_line(tmp_path):
  raw = _raw()
  raw[1]["sub_steps"][0]["function_header"] = None
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in raw))
  with pytest.raises(ValueError, match=r"bad\.jsonl:2: sub_steps\[0\]: field 'function_header'"):
    scicode.load(str(path))
  path.write_text(json.dumps(raw[0]) + "\n{not json\n")
  with pytest.raises(ValueError, match=r"bad\.jsonl:2: not JSON"):
    scicode.load(str(path))


def test_gold_graph_is_a_chain(problems):
  graph = problems[1].gold_graph
  assert [(n["id"], n["title"], n["depends_on"]) for n in graph] == [
      ("2.1", "pressure", []), ("2.2", "moles", ["2.1"]), ("2.3", "temperature", ["2.2"])]
  assert graph[0]["description"].startswith("Write a function returning the pressure")


def test_executor_instructions(problems):
  p = problems[0]
  text = scicode.SciCode(with_background=True).executor_instructions(p, p.gold_graph[1])
  assert "def max_height(v0, g):" in text and "    return h" in text
  assert "import numpy as np" in text and "At the top the velocity is zero" in text
  assert "At the top" not in scicode.SciCode().executor_instructions(p, p.gold_graph[1])


def test_node_scores(problems):
  family, p = scicode.SciCode(), problems[0]
  node = p.gold_graph[1]
  up = {"1.1": VELOCITY}
  good = family.score_node(p, node, MAX_HEIGHT, up)
  assert (good.reward, good.passed, good.details["tests"]) == (1.0, True, 2)
  half = family.score_node(p, node, HALF_RIGHT, up)
  # right only where the answer is 0.0, which `return 0` (and the literal 0.0) pass too
  assert (half.reward, half.passed, half.details["null_baseline"]) == (0.0, False, 1)
  stub = family.score_node(p, node, STUB, up)
  assert stub.reward == 0.0 and "'max_height'" in stub.details["reason"]
  assert family.score_node(p, node, VIA_UPSTREAM, up).passed
  alone = family.score_node(p, node, VIA_UPSTREAM, {})
  assert not alone.passed and "NameError" in alone.details["reason"]


def test_score_problem_and_metrics(problems):
  family, p = scicode.SciCode(), problems[0]
  full = family.score_problem(p, {"1.1": VELOCITY, "1.2": MAX_HEIGHT})
  assert full.passed and full.metrics["step_pass"] == 1.0
  part = family.score_problem(p, {"1.1": VELOCITY, "1.2": None})
  assert not part.passed and part.metrics == {"steps_passed": 1.0, "steps": 2.0,
                                              "step_pass": 0.5, "problem_pass": 0.0}
  results = [full, part, [True, False, False, False], [True, True, True]]
  # steps: 2/2, 1/2, 1/4, 3/3 -> 7/11 overall; per problem 1, .5, .25, 1; all-passed 2 of 4.
  assert scicode.step_pass(results) == pytest.approx(7 / 11)
  assert scicode.mean_step_pass(results) == pytest.approx((1 + 0.5 + 0.25 + 1) / 4)
  assert scicode.problem_pass(results) == 0.5
  assert scicode.step_pass([]) == scicode.mean_step_pass([]) == scicode.problem_pass([]) == 0.0
  assert isinstance(full, ProblemScore)


def test_targets(tmp_path):
  raw = _raw()[2:]
  raw[0]["sub_steps"][0]["test_cases"] = ["assert tri(4) == target", "assert tri(2) == target"]
  path = tmp_path / "targets.json"
  path.write_text(json.dumps(raw))
  p = scicode.load(str(path))[0]
  code = _fence("def tri(n):\n    return n * (n + 1) // 2\n")
  with pytest.raises(scicode.MissingTargetsError, match=r"problem 3 step 3\.1: test case 0"):
    scicode.SciCode().score_node(p, p.gold_graph[0], code, {})
  family = scicode.SciCode(targets={"3.1": [np.int64(10), 3]})
  assert family.score_node(p, p.gold_graph[0], code, {}).passed
  # One of two distinct targets right: no more than a constant (the right one) would pass.
  half = scicode.SciCode(targets={"3.1": [10, 4]}).score_node(p, p.gold_graph[0], code, {})
  assert (half.reward, half.details["tests_passed"], half.details["null_baseline"]) == (0.0, 1, 1)


def test_target_source_round_trips():
  value = {"a": [1.5, float("nan"), -math.inf], "b": (1,), "c": complex(1, -2), "d": None}
  rebuilt = eval(scicode.target_source(value))  # noqa: S307  (our own literal)
  assert rebuilt["b"] == (1,) and rebuilt["c"] == complex(1, -2) and math.isnan(rebuilt["a"][1])
  array = np.arange(6, dtype=np.float32).reshape(2, 3)
  again = eval(scicode.target_source(array))  # noqa: S307
  assert again.dtype == np.float32 and np.array_equal(again, array)
  with pytest.raises(TypeError, match="set"):
    scicode.target_source({1, 2})


def test_split(problems):
  more = copy.copy(problems) + [scicode.load(FIXTURE, {"2": "Biology"})[1],
                                scicode.load(FIXTURE, {"1": "Materials Science"})[0]]
  assert [p.category for p in scicode.split(more, "train")] == [
      "Physics", "Mathematics", "Materials Science"]
  assert [p.category for p in scicode.split(more, "test")] == ["Chemistry", "Biology"]
  with pytest.raises(ValueError, match="'dev'"):
    scicode.split(problems, "dev")


def _code(reply: str) -> str:
  return reply.split("```python\n")[1].split("```")[0]


class _OneReply:
  """Stands in for `Agents`: no router, no LoRA, every executor call answered with `reply`."""

  router = None

  def __init__(self, reply: str):
    self.reply, self.prompts = reply, []

  def tokens(self, messages):
    return messages

  def greedy_routes(self, router_params, nodes):
    return [[] for _ in nodes]

  def expert_set(self, role, route):
    return None

  class model:  # the runner counts context tokens with the model's tokenizer
    class tokenizer:
      encode = staticmethod(lambda text: text.split())

  def generate(self, prompts, sets, experts, **kwargs):
    self.prompts += prompts
    return [self.reply for _ in prompts]

  def replies(self, prompts, sets, experts, **kwargs):
    return [Reply(text, len(text.split()), False)
            for text in self.generate(prompts, sets, experts, **kwargs)]


def test_single_system_runs_the_whole_problem(problems):
  """`single` on SciCode: one node with id "1" (no step number), one reply with every function,
  scored against every step; no error for the node id."""
  import jax
  import ml_collections

  from morse_jax.experiments import experiment
  from morse_jax.mas import runner

  config = ml_collections.ConfigDict({"system": "single"})
  exp = experiment.Experiment(config, None, None, scicode.SciCode(), problems, None)
  p = problems[0]
  graphs = exp.graphs([p])
  assert [n.id for n in graphs[0].nodes] == ["1"]
  agents = _OneReply(_fence(_code(VELOCITY) + _code(HALF_RIGHT)))
  [outcome] = runner.run(agents, exp.family, [p], graphs, None, None, rng=jax.random.key(0))
  asked = agents.prompts[0][-1]["content"]
  assert "STEP 1:" in asked and "def velocity(v0, g, t):" in asked
  assert "STEP 2:" in asked and "def max_height(v0, g):" in asked
  node = outcome.nodes["1"]
  assert (node.score.reward, node.score.passed) == (0.5, True)  # velocity right, max_height not
  assert outcome.score.metrics == {"steps_passed": 1.0, "steps": 2.0, "step_pass": 0.5,
                                   "problem_pass": 0.0}
  agents.reply = _fence(_code(VELOCITY) + _code(MAX_HEIGHT))
  [outcome] = runner.run(agents, exp.family, [p], graphs, None, None, rng=jax.random.key(0))
  assert outcome.score.passed and outcome.nodes["1"].score.reward == 1.0
  agents.reply = STUB  # unusable code: no reward, blocked, and no steps in the problem score
  [outcome] = runner.run(agents, exp.family, [p], graphs, None, None, rng=jax.random.key(0))
  assert not outcome.nodes["1"].score.passed and outcome.score.metrics["steps_passed"] == 0.0
