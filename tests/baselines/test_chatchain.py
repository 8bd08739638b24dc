"""ChatChain's phases on a scripted backbone: each phase's prompt, each loop's exit (on <INFO>, on
the cycle limit, on passing tests), and the counted fallbacks of replies that do not parse."""

import pytest

from morse_jax.baselines import chatchain
from morse_jax.baselines.flow import Task, drive
from morse_jax.tasks.base import Problem
from tests.baselines.scripted import BAD, GOOD, Scripted

STUB = "```python\ndef add(a, b):\n    pass\n```"
PROBLEM = Problem("p0", "humaneval", "c", "def add(a, b):\n  '''Add a and b.'''\n",
                  data={"entry_point": "add"})


def run(respond, tester=lambda code: (True, "2 of 2 examples pass")):
  chat, task = Scripted(respond), Task(PROBLEM, None, tester=tester)
  [final] = drive([chatchain.flow(task)], [task], chat)
  return chat, task, final


def script(**by_phase):
  defaults = {"DemandAnalysis": "<INFO> return a + b", "Coding": GOOD,
              "CodeReviewComment": "<INFO> Finished"}
  replies = {**defaults, **by_phase}
  return lambda ask: replies[ask.phase] if isinstance(replies[ask.phase], str) else (
      replies[ask.phase].pop(0))


def test_the_shortest_chain_and_its_prompts():
  chat, task, final = run(script())
  assert chat.phases() == ["DemandAnalysis", "Coding", "CodeReviewComment"]
  demand, coding, review = chat.asks
  assert "You are Chief Product Officer" in demand.messages[0]["content"]
  assert "<INFO>" in demand.messages[1]["content"]
  assert "You are Programmer" in coding.messages[0]["content"]
  assert 'Ideas: "return a + b"' in coding.messages[1]["content"]  # the demand's conclusion
  assert PROBLEM.statement in coding.messages[1]["content"]
  assert "return a + b" in review.messages[1]["content"] and "<INFO> Finished" in (
      review.messages[1]["content"])
  assert "return a + b" in final and not task.fallbacks


def test_code_complete_runs_until_the_code_is_implemented():
  chat, _, final = run(script(Coding=STUB, CodeComplete=[STUB, GOOD]))
  assert chat.phases().count("CodeComplete") == 2
  [first, _] = chat.prompts("CodeComplete")
  assert "placeholder" in first and "pass" in first  # says what is unimplemented
  assert "return a + b" in final


def test_code_complete_stops_at_its_tries():
  chat, _, _ = run(script(Coding=STUB, CodeComplete=STUB))
  assert chat.phases().count("CodeComplete") == chatchain.COMPLETE_TRIES


def test_review_loop_modifies_with_the_comment_and_stops_at_the_cycle_limit():
  chat, _, _ = run(script(CodeReviewComment="Check negative numbers.",
                          CodeReviewModification=GOOD))
  assert chat.phases().count("CodeReviewComment") == chatchain.REVIEW_CYCLES == 3
  assert chat.phases().count("CodeReviewModification") == 3
  assert all("Check negative numbers." in p for p in chat.prompts("CodeReviewModification"))


def test_review_loop_ends_on_info_finished():
  chat, _, _ = run(script(CodeReviewComment=["Rename a variable.", "<INFO> Finished"],
                          CodeReviewModification=GOOD))
  assert chat.phases().count("CodeReviewComment") == 2
  assert chat.phases().count("CodeReviewModification") == 1


def test_test_loop_puts_the_reports_and_summary_in_the_modification():
  results = [(False, "test 0 (assert add(1, 2) == 3): AssertionError"), (True, "ok")]
  chat, _, final = run(script(Coding=BAD, TestErrorSummary="It subtracts.",
                              TestModification=GOOD), tester=lambda code: results.pop(0))
  assert chat.phases()[-2:] == ["TestErrorSummary", "TestModification"]
  [summary] = chat.prompts("TestErrorSummary")
  assert "assert add(1, 2) == 3" in summary and "return a - b" in summary
  [modification] = chat.prompts("TestModification")
  assert "It subtracts." in modification and "AssertionError" in modification
  assert "return a + b" in final


def test_test_loop_stops_at_the_cycle_limit():
  chat, _, final = run(script(Coding=BAD, TestErrorSummary="?", TestModification=BAD),
                       tester=lambda code: (False, "AssertionError"))
  assert chat.phases().count("TestModification") == chatchain.TEST_CYCLES == 3
  assert "return a - b" in final


def test_unparsable_replies_are_counted_fallbacks():
  chat, task, final = run(script(DemandAnalysis="I think it adds.",
                                 CodeReviewComment=["Add a docstring.", "<INFO> Finished"],
                                 CodeReviewModification="Sure, done."))
  assert task.fallbacks == {"DemandAnalysis": 1, "CodeReviewModification": 1}
  assert 'Ideas: "I think it adds."' in chat.prompts("Coding")[0]  # the reply kept as ideas
  assert "return a + b" in final  # the previous code kept


@pytest.mark.parametrize("reply,conclusion", [("x\n<INFO> sum them", "sum them"),
                                              ("no marker", None)])
def test_info_conclusion(reply, conclusion):
  assert chatchain.info(reply) == conclusion
