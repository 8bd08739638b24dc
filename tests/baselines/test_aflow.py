"""AFlow's HumanEval workflow on a scripted backbone: the operator sequence (three sampled drafts,
ScEnsemble, Test with reflections, the final fix), the ensemble's choice and its fallback."""

import pytest

from morse_jax.baselines import aflow
from morse_jax.baselines.flow import Task, drive
from tests.baselines.scripted import BAD, GOOD, Scripted
from tests.baselines.test_chatchain import PROBLEM

DRAFTS = [f"```python\ndef add(a, b):\n    return {v}\n```" for v in ("a * b", "a + b", "b + a")]


def run(respond, tester):
  chat, task = Scripted(respond), Task(PROBLEM, None, tester=tester)
  [final] = drive([aflow.flow(task, temperature=0.7)], [task], chat)
  return chat, task, final


def script(ensemble="<thought>B and C agree</thought>\n<solution_letter>B</solution_letter>",
           reflect=BAD, fix=GOOD):
  drafts = iter(DRAFTS)
  replies = {"ensemble": ensemble, "reflect": reflect, "fix": fix}
  return lambda ask: next(drafts) if ask.phase == "generate" else replies[ask.phase]


def test_drafts_ensemble_and_a_passing_test():
  tested = []
  chat, task, final = run(script(), lambda code: (tested.append(code) or True, "ok"))
  assert chat.phases() == ["generate"] * 3 + ["ensemble"]
  assert chat.rounds == [3, 1]  # the drafts in one batched call
  assert [a.temperature for a in chat.asks] == [0.7, 0.7, 0.7, 0.0]
  assert aflow.GENERATE in chat.prompts("generate")[0] and PROBLEM.statement in (
      chat.prompts("generate")[0])
  [ensemble] = chat.prompts("ensemble")
  assert all(f"{letter}: \n```python" in ensemble for letter in "ABC")
  assert [t.strip() for t in tested] == ["def add(a, b):\n    return a + b"]  # B, the choice
  assert "return a + b" in final and not task.fallbacks


def test_failing_tests_reflect_three_times_then_fix():
  chat, _, final = run(script(), lambda code: (False, "test 0 (assert add(1, 2) == 3): failed"))
  assert chat.phases() == ["generate"] * 3 + ["ensemble"] + ["reflect"] * 3 + ["fix"]
  assert all("assert add(1, 2) == 3" in p and "### Code Solution" in p
             for p in chat.prompts("reflect"))
  [fix] = chat.prompts("fix")
  assert fix.startswith(aflow.FIX) and "Failed solution:" in fix and "return a + b" in fix
  assert "return a + b" in final


def test_a_reflection_that_passes_ends_the_test():
  results = iter([(False, "failed"), (True, "ok")])
  chat, _, final = run(script(reflect=GOOD), lambda code: next(results))
  assert chat.phases()[4:] == ["reflect"] and "return a + b" in final


def test_an_ensemble_without_a_letter_keeps_the_first_draft():
  tested = []
  _, task, _ = run(script(ensemble="They all look fine."),
                   lambda code: (tested.append(code) or True, "ok"))
  assert task.fallbacks == {"ensemble": 1}
  assert [t.strip() for t in tested] == ["def add(a, b):\n    return a * b"]


@pytest.mark.parametrize("reply,index", [("<solution_letter>c</solution_letter>", 2),
                                         ("<solution_letter> A </solution_letter>", 0),
                                         ("<solution_letter>D</solution_letter>", None),
                                         ("B", None)])
def test_letter(reply, index):
  assert aflow.letter(reply, 3) == index
