"""Retrieval scores against numbers worked out by hand, and the faiss path against numpy."""

import math

import numpy as np
import pytest

from apex_jax.memory import MemoryBank, MemoryBankError, MemoryConfig, NewMemory
from tests.apex.memory.fakes import HashEmbedder, TableEmbedder

R2 = math.sqrt(2)
R5 = math.sqrt(5)


def test_text_only_scores_by_hand(tmp_path):
  # Query q = (1, 0). Memories (question embeddings, not unit on purpose), all bucket time/text:
  #   m1 (2, 0)   correct    cos = 1
  #   m2 (1, 1)   correct    cos = 1/sqrt2 = 0.70711   then judged wrong once: w = 1/2
  #   m5 (1, 2)   correct    cos = 1/sqrt5 = 0.44721   w = 1
  #   m3 (0, 3)   incorrect  cos = 0                   w = 0 / 1 (a failed episode's memory)
  #   m4 (-1, 0)  incorrect  cos = -1                  then judged wrong once: w = 0 / 2
  # min = -1, max = 1, span 2: sim~ = (cos + 1) / 2
  #   m1 1   m2 0.85355   m5 0.72361   m3 0.5   m4 0
  # f = 0.7 sim~ + 0.3 w
  #   m1 0.7 + 0.3 = 1.0
  #   m2 0.7 * 0.85355 + 0.15 = 0.74749
  #   m5 0.7 * 0.72361 + 0.3  = 0.80652   (beats m2 on win rate)
  #   m3 0.35 + 0 = 0.35
  #   m4 0 + 0 = 0
  emb = TableEmbedder({"q": (1, 0), "m1": (2, 0), "m2": (1, 1), "m5": (1, 2), "m3": (0, 3),
                       "m4": (-1, 0)})
  bank = MemoryBank(str(tmp_path / "m.db"), emb)
  ids = {}
  for name, ok in (("m1", True), ("m2", True), ("m5", True), ("m3", False), ("m4", False)):
    ids[name] = bank.add(name, f"summary of {name}", ok, category="time").id
  bank.record_outcome([ids["m2"], ids["m4"]], False)

  got = bank.retrieve("q", category="time")
  assert [s.memory.question for s in got.correct] == ["m1", "m5"]
  assert [s.memory.question for s in got.incorrect] == ["m3", "m4"]
  expect = {"m1": (1.0, 1.0, 1.0), "m5": (1 / R5, (1 / R5 + 1) / 2, 0.7 * (1 / R5 + 1) / 2 + 0.3),
            "m3": (0.0, 0.5, 0.35), "m4": (-1.0, 0.0, 0.0)}
  for s in got.correct + got.incorrect:
    sim, norm, f = expect[s.memory.question]
    assert s.sim == pytest.approx(sim, abs=1e-6)
    assert s.sim_norm == pytest.approx(norm, abs=1e-6)
    assert s.score == pytest.approx(f, abs=1e-6)
  assert got.correct[1].score == pytest.approx(0.80652, abs=1e-5)

  bigger = bank.retrieve("q", category="time", k=3)
  assert [s.memory.question for s in bigger.correct] == ["m1", "m5", "m2"]
  assert bigger.correct[2].score == pytest.approx(0.7 * (1 / R2 + 1) / 2 + 0.15, abs=1e-6)
  replan = bank.retrieve("q", category="time", replan=True)  # k = 1 on replan
  assert [s.memory.question for s in replan.correct + replan.incorrect] == ["m1", "m3"]


def captioned_bank(tmp_path, config=None) -> MemoryBank:
  """Four memories of bucket time, three captioned, one text-image without a caption."""
  emb = TableEmbedder({"q": (1, 0), "c": (0, 1), "m1": (1, 0), "c1": (0, 1), "m2": (0, 1),
                       "c2": (0, 1), "m3": (1, 1), "m4": (1, 0), "c4": (1, 0)})
  bank = MemoryBank(str(tmp_path / "m.db"), emb, config=config)
  bank.add_many([
      NewMemory("m1", "s", False, "time", caption="c1"),
      NewMemory("m2", "s", True, "time", caption="c2"),
      NewMemory("m3", "s", True, "time", modality="text-image"),
      NewMemory("m4", "s", True, "time", caption="c4")])
  return bank


def test_caption_scores_by_hand(tmp_path):
  # Bucket time/text-image, query q = (1, 0) with caption c = (0, 1), beta 0.8:
  #   m1 q(1,0) c(0,1)  incorrect  sim = 0.8 * 1 + 0.2 * 1 = 1.0
  #   m2 q(0,1) c(0,1)  correct    sim = 0.8 * 0 + 0.2 * 1 = 0.2
  #   m3 q(1,1) no cap  correct    sim = cos(q, q3) only = 0.70711
  #   m4 q(1,0) c(1,0)  correct    sim = 0.8 * 1 + 0.2 * 0 = 0.8
  # min 0.2, max 1.0, span 0.8: sim~ = (sim - 0.2) / 0.8 -> m1 1, m2 0, m3 0.63388, m4 0.75
  # w = 1 for the correct ones, 0 for m1: f = 0.7 sim~ + 0.3 w -> m1 0.7, m2 0.3, m3 0.74372,
  # m4 0.825
  bank = captioned_bank(tmp_path)
  got = bank.retrieve("q", "c", category="time", k=3)
  assert got.bucket == ("time", "text-image")
  assert [(s.memory.question, round(s.score, 5)) for s in got.correct] == [
      ("m4", 0.825), ("m3", round(0.7 * (1 / R2 - 0.2) / 0.8 + 0.3, 5)), ("m2", 0.3)]
  assert [(s.memory.question, s.score) for s in got.incorrect] == [("m1", pytest.approx(0.7))]

  # Without a query caption every memory scores cos(q, q_i): m1 1, m2 0, m3 0.70711, m4 1.
  plain = bank.retrieve("q", category="time", modality="text-image", k=3)
  assert [(s.memory.question, round(s.score, 5)) for s in plain.correct] == [
      ("m4", 1.0), ("m3", round(0.7 / R2 + 0.3, 5)), ("m2", 0.3)]


def test_text_image_off_keeps_captions_out(tmp_path):
  """MemoryConfig(text_image=False): the memories of test_caption_scores_by_hand are stored
  without captions in the text-only bucket (an explicit text-image modality too) and score by
  cos(q, q_i) alone, the query's caption ignored: m1 1, m2 0, m3 0.70711, m4 1."""
  bank = captioned_bank(tmp_path, MemoryConfig(text_image=False))
  got = bank.retrieve("q", "c", category="time", k=3)
  assert got.bucket == ("time", "text-only")
  assert [(s.memory.question, round(s.score, 5)) for s in got.correct] == [
      ("m4", 1.0), ("m3", round(0.7 / R2 + 0.3, 5)), ("m2", 0.3)]
  assert all(s.memory.caption is None for s in got.correct + got.incorrect)
  context = bank.planner_context("q", "c", category="time")
  assert context.bucket == ("time", "text-only")
  with pytest.raises(MemoryBankError, match="text_image must be a bool"):
    MemoryConfig(text_image=1)


def test_all_equal_similarities_normalise_to_one(tmp_path):
  # One memory, or many with the same sim: sim~ = 1 by definition, so f = 0.7 + 0.3 w.
  emb = TableEmbedder({"q": (1, 0), "a": (0, 1), "b": (0, 2)})
  bank = MemoryBank(str(tmp_path / "m.db"), emb)
  a = bank.add("a", "s", True, category="event").id
  only = bank.retrieve("q", category="event")
  assert only.correct[0].sim_norm == 1.0 and only.correct[0].score == pytest.approx(1.0)
  bank.add_many([NewMemory("b", "s", True, "event")], dedup=False)  # same direction as a
  bank.record_outcome([a], False)                          # w_a = 1/2
  both = bank.retrieve("q", category="event")
  assert [s.memory.question for s in both.correct] == ["b", "a"]
  assert [s.score for s in both.correct] == pytest.approx([1.0, 0.7 + 0.15])


def test_empty_bank_and_bucket(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder())
  assert bank.retrieve("anything", category="time").memory_ids == ()
  bank.add("when did it happen", "s", True, category="time")
  assert bank.retrieve("who is it", category="human").memory_ids == ()
  ctx = bank.planner_context("who is it", category="human")
  assert ctx.text.endswith("None found.") and ctx.skill is None


def test_retrieve_validates_input(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder())
  bank.add("q one", "s", True, category="time")
  with pytest.raises(MemoryBankError, match="category must be one of .*'weather'"):
    bank.retrieve("q", category="weather")
  with pytest.raises(MemoryBankError, match="modality must be one of .*'video'"):
    bank.retrieve("q", category="time", modality="video")
  with pytest.raises(MemoryBankError, match="k must be an integer >= 1; got 0"):
    bank.retrieve("q", category="time", k=0)
  with pytest.raises(MemoryBankError, match="question must be a non-empty string"):
    bank.retrieve("  ", category="time")


def _random_bank(path, n, dim, rng, config, captions):
  table = {f"t{i}": rng.normal(size=dim) for i in range(2 * n)}
  table.update({f"q{i}": rng.normal(size=dim) for i in range(40)})
  emb = TableEmbedder(table)
  items = [NewMemory(f"t{i}", "s", bool(rng.random() < 0.5), "process",
                     modality="text-image" if captions else None,
                     caption=f"t{n + i}" if captions and rng.random() < 0.7 else None)
           for i in range(n)]
  bank = MemoryBank(path, emb, config=config)
  ids = [r.id for r in bank.add_many(items, dedup=False)]
  for r in range(6):  # spread the win rates, so f often ranks far from sim (w = 1 is rare)
    bank.record_outcome([i for i in ids if rng.random() < 0.8], r % 2 == 0)
  return emb


@pytest.mark.parametrize("alpha,captions", [(0.7, False), (0.7, True), (0.1, False)])
def test_faiss_path_matches_numpy(tmp_path, alpha, captions):
  rng = np.random.default_rng(0)
  path = str(tmp_path / "m.db")
  emb = _random_bank(path, 1000, 16, rng, MemoryConfig(alpha=alpha), captions)
  exact = MemoryBank(path, emb, config=MemoryConfig(alpha=alpha, faiss_threshold=10**9))
  fast = MemoryBank(path, emb, config=MemoryConfig(alpha=alpha, faiss_threshold=2))
  modality = "text-image" if captions else "text-only"
  for i in range(20):
    caption = f"q{39 - i}" if captions and i % 2 else None
    for k in (1, 5):
      a = exact.retrieve(f"q{i}", caption, category="process", modality=modality, k=k)
      b = fast.retrieve(f"q{i}", caption, category="process", modality=modality, k=k)
      assert a.memory_ids == b.memory_ids
      assert [s.score for s in a.correct + a.incorrect] == pytest.approx(
          [s.score for s in b.correct + b.incorrect], abs=1e-5)
  assert fast._caches[("process", modality)]._faiss  # the faiss path really ran


def test_cache_sees_other_connections(tmp_path):
  # Bank A caches the bucket; bank B (another connection) changes win rates and adds a memory.
  emb = TableEmbedder({"q": (1, 0), "a": (1, 0.1), "b": (1, -0.5), "c": (1, 0.05)})
  path = str(tmp_path / "m.db")
  a_bank, b_bank = MemoryBank(path, emb), MemoryBank(path, emb)
  a_id = a_bank.add("a", "s", True, category="time").id
  a_bank.add("b", "s", True, category="time")
  assert a_bank.retrieve("q", category="time").correct[0].memory.question == "a"
  b_bank.record_outcome([a_id], False)
  b_bank.record_outcome([a_id], False)                     # w_a = 1/3
  got = a_bank.retrieve("q", category="time")
  assert got.correct[0].memory.win_rate == pytest.approx(1 / 3)
  assert got.correct[0].score == pytest.approx(0.7 + 0.3 / 3)  # a stale cache would say 1.0
  b_bank.add("c", "s", True, category="time")
  assert a_bank.retrieve("q", category="time", k=3).correct[0].memory.question == "c"
