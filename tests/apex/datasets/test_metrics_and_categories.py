"""evaluate() on hand-computed numbers; the keyword category rule."""

import pytest

from apex_jax.datasets import RULES, DatasetError, QAExample, evaluate, keyword_category
from apex_jax.memory import CATEGORIES


def _ex(qid, answers, category="human", hops=2):
  return QAExample(id=qid, question=f"question {qid}?", answers=tuple(answers),
                   category=category, hops=hops)


EXAMPLES = [
    _ex("a", ["Barack Obama"], "human", 1),
    _ex("b", ["Paris", "City of Paris"], "location", 2),
    _ex("c", ["yes"], "others", 2),
    _ex("d", ["1889"], "time", 3),
]


def test_evaluate_hand_computed():
  predictions = {
      "a": "Barack Obama Jr.",  # EM 0, F1: p 2/3, r 1 -> 0.8
      "b": "the city of paris",  # EM 1 with the alias
      "c": "yes it is",  # yes/no match only themselves: 0, 0
      # "d" missing: 0, 0
      "zzz": "ignored",
  }
  out = evaluate(predictions, EXAMPLES)
  assert out["n"] == 4 and out["missing"] == 1 and out["extra"] == 1
  assert out["em"] == pytest.approx(1 / 4)
  assert out["f1"] == pytest.approx((0.8 + 1.0) / 4)
  assert out["per_category"]["human"] == pytest.approx({"em": 0.0, "f1": 0.8, "n": 1})
  assert out["per_category"]["location"] == pytest.approx({"em": 1.0, "f1": 1.0, "n": 1})
  assert out["per_hops"][2] == pytest.approx({"em": 0.5, "f1": 0.5, "n": 2})
  assert out["per_hops"][3] == pytest.approx({"em": 0.0, "f1": 0.0, "n": 1})
  assert out["f1_per_question"] == pytest.approx({"a": 0.8, "b": 1.0, "c": 0.0, "d": 0.0})


def test_evaluate_rejects_unlabelled_duplicates_and_non_strings():
  with pytest.raises(DatasetError, match="example 'u' has no gold answer"):
    evaluate({}, [_ex("u", [])])
  with pytest.raises(DatasetError, match="id 'a' appears twice"):
    evaluate({}, [EXAMPLES[0], EXAMPLES[0]])
  with pytest.raises(DatasetError, match="prediction for id 'a' must be a string, got int"):
    evaluate({"a": 3}, EXAMPLES)


def test_qaexample_validates_its_fields():
  with pytest.raises(DatasetError, match="QAExample.category must be one of .* got 'place'"):
    _ex("x", ["y"], "place")
  with pytest.raises(DatasetError, match="QAExample.hops must be an integer >= 1; got 0"):
    _ex("x", ["y"], hops=0)
  with pytest.raises(DatasetError, match="QAExample.answers must be a tuple of strings"):
    QAExample(id="x", question="q?", answers=["y"], category="human", hops=1)


@pytest.mark.parametrize("question,category", [
    # the APEx authors' few-shot examples (Memory-Serve/memory_serve.py)
    ("Abraham Lokin was born on an archipelago between the Norwegian Sea and North Atlantic, "
     "that is about 200 miles north-northwest of where?", "location"),
    ("According to Google Finance, when was the first year the Apple stock went above $50?",
     "time"),
    ("How long did the war last?", "time"),
    ("How many people live in Tarsk?", "property"),
    ("How is paper made?", "process"),
    ("What government position was held by the woman who portrayed Corliss Archer?", "career"),
    ("Who founded the company?", "human"),
    ("Which tournament did the team win?", "event"),
    ("What is the device used for?", "function"),
    ("What is a neutron star?", "definition"),
    ("Is the moon made of cheese?", "others"),
    ("Which film came out first, Blind Shaft or The Mask Of Fu Manchu?", "others"),
])
def test_keyword_rule(question, category):
  assert keyword_category(question) == category


def test_every_category_has_a_rule():
  assert {c for c, _ in RULES} == set(CATEGORIES)
