import pytest

from apex_jax.judges import rule


def test_normalize_drops_case_punctuation_articles_spaces():
  assert rule.normalize_answer("  The  Eiffel-Tower, in Paris! ") == "eiffeltower in paris"
  assert rule.normalize_answer("An apple a day") == "apple day"


def test_exact_match_best_over_golds():
  assert rule.exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
  assert rule.exact_match("Beatles band", "Beatles") == 0.0


def test_f1_hand_computed():
  # pred {barack, obama, jr}, gold {barack, obama}: p = 2/3, r = 1, f1 = 0.8
  assert rule.f1("Barack Obama Jr.", "Barack Obama") == pytest.approx(0.8)
  # counts matter: pred "x y y" vs gold "y" share one "y": p = 1/3, r = 1, f1 = 0.5
  assert rule.f1("x y y", "y") == pytest.approx(0.5)
  assert rule.f1("Paris", ["London", "paris"]) == 1.0
  assert rule.f1("nothing alike", "Paris") == 0.0


def test_yes_no_only_match_themselves():
  assert rule.f1("yes it is", "yes") == 0.0
  assert rule.f1("yes", "yes") == 1.0


def test_empty_golds_is_an_error():
  with pytest.raises(ValueError, match="answers is empty"):
    rule.exact_match("x", [])
