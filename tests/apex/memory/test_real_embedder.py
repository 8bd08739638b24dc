"""The bank with the real offline all-MiniLM-L6-v2 embedder (slow: loading torch takes ~10 s)."""

import pytest

from apex_jax.memory import CentroidClassifier, MemoryBank


@pytest.mark.slow
def test_sentence_embedder_routes_and_retrieves(tmp_path):
  from morse_jax.lora.embedders import SentenceEmbedder

  emb = SentenceEmbedder()
  clf = CentroidClassifier(emb)
  assert clf("In which year was the Eiffel Tower completed?") == "time"
  assert clf("Where is the Louvre museum located?") == "location"
  assert clf("Who wrote the play Hamlet?") == "human"
  assert clf("What is the purpose of a catalytic converter?") == "function"

  bank = MemoryBank(str(tmp_path / "m.db"), emb, classifier=clf)
  bank.add("In which year was the Eiffel Tower completed?", "1. search tower history", True)
  bank.add("In what year did the Berlin Wall fall?", "1. search wall", True)
  bank.add("When was the Golden Gate Bridge opened?", "1. guess", False)
  got = bank.retrieve("What year was the Eiffel Tower finished?")
  assert got.bucket == ("time", "text-only")
  assert got.correct[0].memory.question.startswith("In which year was the Eiffel Tower")
  assert got.incorrect[0].memory.question.startswith("When was the Golden Gate")
  dup = bank.add("In which year was the Eiffel Tower completed?", "1. search", True)
  assert dup.action == "replaced" and dup.similarity >= 0.9999  # a shorter summary wins
