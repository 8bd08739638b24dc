"""The term-overlap searches (tools.overlap): hand-computed idf scores, ties in corpus order,
and the trigram search finding a passage by a misspelled name that the word search misses."""

import math

import pytest

from apex_jax.tools.passages import Passage
from apex_jax.tools.overlap import NgramSearch, WordSearch, trigrams

PASSAGES = [Passage("a", "Purkir Denos is a writer."), Passage("b", "Tomsa Rilo is a pilot."),
            Passage("c", "Benza is a city.")]


def test_word_scores_are_idf_sums():
  s = WordSearch(PASSAGES, topk=2)
  # "is" is in all 3 passages, "writer" in 1: log(1 + 3/3) + log(1 + 3/1)
  assert s.scores("is writer")[0] == pytest.approx(math.log(2) + math.log(4))
  assert [p.id for p in s.search(["is"])[0]] == ["a", "b"]  # a tie: corpus order


def test_trigrams_of_padded_words():
  assert trigrams("Lun Ab") == {" lu", "lun", "un ", " ab", "ab "}


def test_trigram_search_tolerates_a_misspelled_name():
  query = "Purkur Denkur occupation"
  assert WordSearch(PASSAGES, topk=1).scores(query).max() == 0.0  # no word in common
  assert [p.id for p in NgramSearch(PASSAGES, topk=1).search([query])[0]] == ["a"]
  with pytest.raises(ValueError, match="NgramSearch.topk must be an integer >= 1"):
    NgramSearch(PASSAGES, topk=0)
