"""SRDD: CSV loading, the category split, node rewards and program metrics (fake embedder)."""

from __future__ import annotations

import os

import pytest

from morse_jax.tasks import srdd

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "srdd_mini.csv")


from benchmarks.null_sweep import bag_of_words  # a deterministic stand-in embedder


GOOD = ("```python\nexpenses = {}\n\ndef record(category, amount):\n"
        "  expenses[category] = expenses.get(category, 0) + amount\n\n"
        "record('food', 3)\nprint('total spent per category', expenses)\n```")
STUB = "```python\ndef record(category, amount):\n  pass\n\nrecord('food', 3)\n```"
CRASH = "```python\nexpenses = {}\nprint(expenses['food'])\n```"
SERVER = "```python\nwhile True:\n  expenses = {'food': 1}\n```"


@pytest.fixture(scope="module")
def problems():
  return srdd.load(FIXTURE)


@pytest.fixture
def family():
  return srdd.SRDD(embedder=bag_of_words, timeout_s=1.0)


def _node(title="record expenses", description="record expenses with amounts and categories"):
  return {"id": "1", "title": title, "description": description, "depends_on": []}


def test_load(problems):
  assert len(problems) == 9
  p = problems[2]
  assert (p.id, p.category, p.family, p.gold_graph) == ("ExpenseTracker", "Work", "srdd", None)
  assert p.statement.startswith("ExpenseTracker: Create an expense tracker")
  assert p.data["description"].endswith("per category.")


def test_load_errors(tmp_path):
  path = tmp_path / "bad.csv"
  path.write_text('Name,Description\nA,"a"\n')
  with pytest.raises(ValueError, match=r"bad\.csv:1: header lacks column 'category'"):
    srdd.load(str(path))
  path.write_text('name,description,category\nA,"multi\nline",Game\n\nB,,Game\n')
  with pytest.raises(ValueError, match=r"bad\.csv:5: field 'description' is missing or empty"):
    srdd.load(str(path))
  path.write_text('name,description,category\nA,desc\n')
  with pytest.raises(ValueError, match=r"bad\.csv:2: field 'category'"):
    srdd.load(str(path))
  path.write_text("")
  with pytest.raises(ValueError, match=r"bad\.csv: empty file"):
    srdd.load(str(path))
  path.write_text("Category,Name,Description,Extra\nGame,A,d,x\nGame,A,e,y\n")
  assert [p.id for p in srdd.load(str(path))] == ["A", "A#2"]


def test_split(problems):
  test = srdd.split(problems, "test", seed=0, holdout=2)
  train = srdd.split(problems, "train", seed=0, holdout=2)
  assert len({p.category for p in test}) == 2
  assert not {p.category for p in test} & {p.category for p in train}
  assert sorted(p.id for p in test + train) == sorted(p.id for p in problems)
  again = srdd.split(list(reversed(problems)), "test", seed=0, holdout=2)  # order-free
  assert {p.category for p in again} == {p.category for p in test}
  seeds = {tuple(sorted({p.category for p in srdd.split(problems, "test", seed=s, holdout=2)}))
           for s in range(10)}
  assert len(seeds) > 1
  with pytest.raises(ValueError, match="cannot hold out 8 of 5"):
    srdd.split(problems, "test")


def test_strip_comments():
  code = 'def f():\n  """Doc."""\n  return 1  # note\n# expense tracker\n'
  assert srdd.strip_comments(code) == "def f():\n    return 1"
  assert srdd.strip_comments("x = (\n# c\ny") == "x = (\ny"


def test_node_rewards(problems, family):
  p = problems[2]
  good = family.score_node(p, _node(), GOOD, {})
  d = good.details
  assert (d["smoke"], d["complete"], good.passed) == (1.0, 1.0, True)
  assert 0 < d["task_consistency"] < 1 and 0 < d["subtask_consistency"] < 1
  expected = (0.5 + 0.5 + 0.7 * d["task_consistency"] + 0.3 * d["subtask_consistency"]) / 2
  assert good.reward == pytest.approx(expected)
  stub = family.score_node(p, _node(), STUB, {})
  assert (stub.details["smoke"], stub.details["complete"], stub.passed) == (1.0, 0.0, False)
  assert "'record'" in stub.details["reason"]
  crash = family.score_node(p, _node(), CRASH, {})
  assert crash.details["smoke"] == 0.0 and "KeyError" in crash.details["reason"]
  assert not crash.passed
  assert family.score_node(p, _node(), SERVER, {}).details["smoke"] == 1.0  # ChatDev's rule
  assert srdd.SRDD(bag_of_words, 1.0, timeout_ok=False).score_node(
      p, _node(), SERVER, {}).details["smoke"] == 0.0
  # Upstream code runs first, so a node may use what it defines.
  uses = family.score_node(p, _node(), "```python\nprint(expenses)\n```", {"0": GOOD})
  assert uses.details["smoke"] == 1.0
  assert family.score_node(p, _node(), "no code", {}).reward == 0.0


def test_pasting_the_requirement_in_comments_earns_nothing(problems, family):
  p = problems[2]
  pasted = "```python\n# " + p.statement + "\n'''" + p.statement + "'''\nx = 1\n```"
  score = family.score_node(p, _node(), pasted, {})
  assert score.details["task_consistency"] < 0.2


def test_program_metrics(problems, family):
  p = problems[2]
  good = family.score_problem(p, {"a": GOOD, "b": "```python\nprint(len(expenses))\n```"})
  m = good.metrics
  assert good.passed and (m["exec"], m["completeness"], m["executability"]) == (1.0, 1.0, 1.0)
  assert m["eci_mean"] == pytest.approx((2 + m["consistency"]) / 3)
  assert m["eci_product"] == pytest.approx(m["consistency"]) and m["reward"] == m["eci_mean"]
  crash = family.score_problem(p, {"a": GOOD, "b": CRASH})
  assert not crash.passed and (crash.metrics["exec"], crash.metrics["reward"]) == (0.0, 0.0)
  blocked = family.score_problem(p, {"a": GOOD, "b": None})
  assert blocked.metrics["exec"] == 1.0 and blocked.metrics["completeness"] == 0.0
  assert not blocked.passed and blocked.metrics["reward"] > 0
  empty = family.score_problem(p, {"a": None})
  assert (empty.metrics["exec"], empty.metrics["reward"], empty.metrics["consistency"]) == (
      0.0, 0.0, 0.0)


def test_instructions_and_default_embedder_is_lazy(problems):
  family = srdd.SRDD()
  assert family.embedder is None  # nothing loaded until a score needs it
  text = family.executor_instructions(problems[0], _node("store scores", "keep the scores"))
  assert "GradeBook" in text and "store scores" in text and "```python" in text


@pytest.mark.slow
def test_default_sentence_embedder(problems):
  """The real MiniLM embedder (a model load, ~20 s): related code scores above unrelated code."""
  family = srdd.SRDD(timeout_s=2.0)
  p = problems[2]
  related = family.score_node(p, _node(), GOOD, {}).details["task_consistency"]
  unrelated = family.score_node(
      p, _node(), "```python\nimport math\nprint(math.factorial(5))\n```", {})
  assert related > unrelated.details["task_consistency"]
