"""Reading judge replies: every reply shape, and what is not a verdict or a score."""

import pytest

from apex_jax.judges import replies

CHOICES = {"A": "correct", "B": "incorrect", "C": "not_attempted", "CORRECT": "correct",
           "INCORRECT": "incorrect", "NOT ATTEMPTED": "not_attempted"}


@pytest.mark.parametrize("text, verdict, how", [
    ("A", "correct", "exact"),
    ("b", "incorrect", "exact"),
    ("**B**.", "incorrect", "exact"),
    ('"C"', "not_attempted", "exact"),
    ("<think>A or B? maybe A</think>\nB", "incorrect", "exact"),
    ('Sure: {"verdict": "B", "reason": "contradicts"} done', "incorrect", "json"),
    ("Verdict: A", "correct", "label"),
    ("Grade: NOT_ATTEMPTED", "not_attempted", "label"),
    ("Final answer: **B** because", "incorrect", "label"),
    ("A: CORRECT\nThe answer matches.", "correct", "line"),
    ("The gold target is included.\nA", "correct", "line"),
    ("Correct.", "correct", "exact"),
    ("INCORRECT", "incorrect", "exact"),
])
def test_find_verdict_shapes(text, verdict, how):
  assert replies.find_verdict(text, CHOICES) == (verdict, how)


@pytest.mark.parametrize("text", ["A correct answer is given", "A or B", "", "maybe", "ABBA",
                                  '{"verdict": "D"}', "<think>A</think>"])
def test_find_verdict_misses(text):
  assert replies.find_verdict(text, CHOICES) == (None, "")


@pytest.mark.parametrize("text, number, how", [
    ("- Score: 7\n- Reason: sound chain", 7.0, "label"),
    ('{"score": 8, "reason": "ok"}', 8.0, "json"),
    ('{"score": "6/10"}', 6.0, "json"),
    ("**Score:** 8.5", 8.5, "label"),
    ("I give it 7/10 overall.", 7.0, "ratio"),
    (" 9. ", 9.0, "bare"),
    ("Score = -3", -3.0, "label"),
])
def test_find_number_shapes(text, number, how):
  assert replies.find_number(text) == (number, how)


@pytest.mark.parametrize("text", ["no digits here", "Scored well", "Step 1 then step 2", ""])
def test_find_number_misses(text):
  assert replies.find_number(text) == (None, "")


def test_reason_and_think():
  assert replies.find_reason("- Score: 7\n- Reason: clear steps") == "clear steps"
  assert replies.find_reason('{"score": 1, "reason": " made up "}') == "made up"
  assert replies.find_reason("7") == ""
  assert replies.strip_think("<think>x</think> A<|im_end|>") == "A"
  assert replies.strip_think("<think>unfinished") == "unfinished"


def test_failure_counts_reject_unknown_kinds():
  counts = replies.FailureCounts(("a", "b"))
  counts.add("a")
  counts.add("a")
  assert counts.snapshot() == {"a": 2, "b": 0} and counts.total == 2
  with pytest.raises(ValueError, match="unknown failure kind 'c'"):
    counts.add("c")
