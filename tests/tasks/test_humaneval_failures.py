"""benchmarks.humaneval_failures: each cause read off records that the real verifier wrote."""

from __future__ import annotations

import json

import pytest

from benchmarks import humaneval_failures
from morse_jax.tasks import humaneval


@pytest.fixture(scope="module")
def problem():
  return next(p for p in humaneval.load() if p.id == "HumanEval/0")


def _record(problem, reply, cpu_s=10.0, **extra):
  family = humaneval.HumanEval(per_test_timeout_s=cpu_s)
  score = family.score_node(problem, problem.gold_graph[0], reply, {})
  return {"kind": "node", "problem_id": problem.id, "reply": reply, "passed": score.passed,
          "reason": score.details.get("reason", ""), **extra}


def test_each_cause_from_the_verifiers_own_reasons(problem):
  head = "```python\ndef has_close_elements(numbers, threshold):\n"
  replies = {
      "wrong_answer": head + "    return False\n```",
      "placeholder": head + "    pass\n```",
      "syntax": head + "    return (numbers\n```",
      "error": head + "    return numbers[10 ** 6]\n```",
      "timeout": head + "    while True:\n        pass\n    return False\n```",
  }
  # a short CPU limit for the endless loop only: the others must not run out of time
  lines = [json.dumps(_record(problem, reply, 2.0 if cause == "timeout" else 10.0))
           for cause, reply in replies.items()]
  lines.append(json.dumps(_record(problem, head + "    return False\n", cut=True)))
  passing = _record(problem, humaneval.canonical_artifact(problem))
  assert passing["passed"]
  lines += [json.dumps(passing), json.dumps({"kind": "problem", "problem_id": problem.id})]
  found = humaneval_failures.failures(lines)
  assert [r["cause"] for r in found] == list(replies) + ["cut"], found
  assert "IndexError" in found[3]["reason"]


def test_reasons_of_the_harness_and_of_the_strict_comparisons():
  cause = lambda reason: humaneval_failures.cause({"reason": reason})
  assert cause("no fenced code block in the reply") == "no_code"
  assert cause("test run failed: the harness gave no summary: Killed") == "harness"
  assert cause("test 0 (check(f)): StrictComparisonError: zip: lengths 2 and 3") == "strict"
  assert cause("TODO comment at line 3: # TODO: fill in") == "placeholder"
