"""Adding (dedup rule), win rates, input checks, JSON export/import, Planner context."""

import hashlib
import json
import os

import numpy as np
import pytest

from apex_jax.memory import MemoryBank, MemoryBankError, MemoryConfig, NewMemory
from tests.apex.memory.fakes import HashEmbedder

Q = "when was the eiffel tower built"
NO_GATE = MemoryConfig(dedup_gate=None)  # the default, spelled out


def _random_embedder(texts):
  """A fixed random float32 vector per text (not exactly representable in decimal)."""
  seeds = [int(hashlib.md5(t.encode()).hexdigest(), 16) % 2**32 for t in texts]
  return np.stack([np.random.default_rng(s).normal(size=32) / 3 for s in seeds]).astype(
      np.float32)


def _bank(tmp_path, config=None, name="m.db"):
  return MemoryBank(str(tmp_path / name), HashEmbedder(), config=config)


@pytest.mark.parametrize("old_ok,old_summary,new_summary,action", [
    (False, "1. search 2. answer", "1. search 2. check 3. answer", "replaced"),  # old incorrect
    (True, "1. search 2. answer", "1. answer", "replaced"),                      # new shorter
    (True, "1. search 2. answer", "1. look 2. answer", "dropped"),               # same length
    (True, "1. answer", "1. search 2. answer", "dropped"),                       # new longer
])
def test_dedup_rule(tmp_path, old_ok, old_summary, new_summary, action):
  bank = _bank(tmp_path, NO_GATE)
  old = bank.add(Q, old_summary, old_ok, category="time")
  new = bank.add(Q.upper(), new_summary, True, category="time")  # same words: sim 1
  assert new.action == action and new.other_id == old.id
  assert new.similarity == pytest.approx(1.0, abs=1e-6)
  assert bank.count("time/text-only") == 1
  kept = bank.memories("time/text-only")[0]
  if action == "replaced":
    assert bank.get(old.id) is None and kept.id == new.id > old.id
    assert kept.workflow_summary == new_summary and kept.win_rate == 1.0
  else:
    assert new.id is None and kept.id == old.id and kept.workflow_summary == old_summary
  assert bank.counters[action] == 1


def test_dedup_gate_of_ttrl_servers(tmp_path):
  # Gate 0.7: an old memory with w >= 0.7 is never replaced; the new one is added too.
  bank = _bank(tmp_path, MemoryConfig(dedup_gate=0.7))
  old = bank.add(Q, "1. search 2. answer", True, category="time")
  dup = bank.add(Q, "1. answer", True, category="time")
  assert (dup.action, dup.other_id) == ("added_duplicate", old.id)
  assert bank.count(("time", "text-only")) == 2
  # Once the old one's win rate falls below 0.7 (1/2), the rule applies: shorter replaces it.
  other = bank.add("who built the tower", "s", True, category="time").id
  bank.record_outcome([old.id, dup.id, other], False)
  again = bank.add(Q, "answer", True, category="time")
  assert (again.action, again.other_id) == ("replaced", old.id)
  assert bank.count(("time", "text-only")) == 3


def test_dedup_within_one_batch_and_across_buckets(tmp_path):
  bank = _bank(tmp_path, NO_GATE)
  res = bank.add_many([NewMemory(Q, "a b c", False, "time"), NewMemory(Q, "a b", True, "time"),
                       NewMemory(Q, "a b", True, "event"),
                       NewMemory(Q, "a", True, "time", caption="a photo of a tower")])
  assert [r.action for r in res] == ["added", "replaced", "added", "added"]
  assert res[1].other_id == res[0].id
  assert bank.count("time/text-only") == 1 and bank.count("time/text-image") == 1
  assert bank.add_many([NewMemory(Q, "x", True, "time")], dedup=False)[0].action == "added"


def test_a_new_memory_counts_its_own_episode_as_its_first_use(tmp_path):
  """A correct episode's memory starts at 1 win in 1 use (w = 1), a failed one's at 0 in 1
  (w = 0), in the stored row and in the retrieval cache that ranks by w."""
  bank = _bank(tmp_path)
  won = bank.add("who founded the city", "1. search founder", True, category="human").id
  lost = bank.add("who built the bridge", "1. search builder", False, category="human").id
  assert [(bank.get(i).success_count, bank.get(i).usage_count, bank.get(i).win_rate)
          for i in (won, lost)] == [(1, 1, 1.0), (0, 1, 0.0)]
  got = bank.retrieve("who built the bridge", category="human")
  assert [(s.memory.id, s.memory.win_rate) for s in got.incorrect] == [(lost, 0.0)]
  # f = alpha sim~ + (1 - alpha) w: the only incorrect memory has sim~ 1 (its own question)
  alpha = bank.config.alpha
  assert got.incorrect[0].score == pytest.approx(alpha * 1.0 + (1 - alpha) * 0.0)
  # a replacement (dedup of the same question) starts afresh too
  again = bank.add("who built the bridge", "1. search", False, category="human")
  assert again.action == "replaced" and bank.get(again.id).win_rate == 0.0
  bank.close()


def test_record_outcome_updates_win_rates(tmp_path):
  bank = _bank(tmp_path)
  a = bank.add("a question", "s", True, category="human").id
  b = bank.add("another one", "s", False, category="human").id
  res = bank.record_outcome([a, a, b], True)  # a counted once
  assert res.updated == (a, b) and res.missing == ()
  res = bank.record_outcome([a], False)
  assert (bank.get(a).success_count, bank.get(a).usage_count, bank.get(a).win_rate) == (
      2, 3, pytest.approx(2 / 3))
  assert (bank.get(b).success_count, bank.get(b).usage_count) == (1, 2)  # started 0 / 1
  res = bank.record_outcome([b, 12345], "incorrect")
  assert res.missing == (12345,) and bank.counters["outcome_missing_id"] == 1
  assert bank.get(b).win_rate == pytest.approx(1 / 3)
  with pytest.raises(MemoryBankError, match="memory id must be an integer; got 'x'"):
    bank.record_outcome(["x"], True)
  with pytest.raises(MemoryBankError, match="correct must be True/False"):
    bank.record_outcome([a], "maybe")


def test_add_validates_input(tmp_path):
  bank = _bank(tmp_path)
  with pytest.raises(MemoryBankError, match="category must be one of .*got 'sports'"):
    bank.add(Q, "s", True, category="sports")
  with pytest.raises(MemoryBankError, match="modality must be one of .*got 'audio'"):
    bank.add(Q, "s", True, category="time", modality="audio")
  with pytest.raises(MemoryBankError, match="outcome must be True/False .*got 'yes'"):
    bank.add(Q, "s", "yes", category="time")
  with pytest.raises(MemoryBankError, match="memory 1: unknown field 'answer'"):
    bank.add_many([dict(question=Q, workflow_summary="s", outcome=True, category="time"),
                   dict(question=Q, workflow_summary="s", outcome=True, answer="1889")])
  with pytest.raises(MemoryBankError, match="memory 0: question must be a non-empty string"):
    bank.add_many([dict(question="", workflow_summary="s", outcome=True, category="time")])
  assert len(bank) == 0  # nothing of a rejected batch was stored
  bank.add(Q, "s", True, category="time")
  bank.embedder = HashEmbedder(dim=8)
  with pytest.raises(MemoryBankError, match="embedding dim 8 of question texts does not match "
                                            "the bank's dim 32"):
    bank.add("other", "s", True, category="time")
  bank.embedder = lambda texts: np.full((len(texts), 32), np.nan)
  with pytest.raises(MemoryBankError, match="non-finite values for question 'other'"):
    bank.add("other", "s", True, category="time")
  bank.embedder = lambda texts: np.zeros((1, 32))
  with pytest.raises(MemoryBankError, match=r"shape \(1, 32\) for 2 question texts"):
    bank.add_many([NewMemory("x", "s", True, "time"), NewMemory("y", "s", True, "time")])
  assert len(bank) == 1


def test_category_routed_by_classifier(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), classifier=lambda q: "career")
  res = bank.add("what was her job", "s", True, caption=" ")  # blank caption: text-only
  assert bank.get(res.id).bucket == ("career", "text-only")
  assert bank.retrieve("what was his job").bucket == ("career", "text-only")
  assert bank.retrieve("what was his job", "a man").bucket == ("career", "text-image")
  bad = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), classifier=lambda q: "Career!")
  with pytest.raises(MemoryBankError, match="got 'Career!'"):
    bad.add("q", "s", True)


def test_json_round_trip_is_exact(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), _random_embedder)
  ids = [r.id for r in bank.add_many(
      [NewMemory(f"question {i}", f"summary {i}", i % 3 == 0, "property",
                 caption=f"caption {i}" if i % 2 else None, data_id=f"d{i}")
       for i in range(12)])]
  bank.record_outcome(ids[:5], False)
  bank.apply_distiller_reply(("property", "text-only"), json.dumps(
      {"operation": "synthesize", "absorbed_ids": [ids[0]],
       "skill": {"description": "d", "procedure": [{"step": 1, "action": "a", "purpose": "p"}],
                 "pitfalls": ["x"]}}))
  conn = bank._conn
  conn.execute("DELETE FROM memories WHERE id = ?", (ids[-1],))  # ids of deleted stay unused
  bank._caches.clear()
  first, second = tmp_path / "a.json", tmp_path / "b.json"
  bank.export_json(str(first))

  copy = MemoryBank(str(tmp_path / "copy.db"), _random_embedder)
  assert copy.import_json(str(first)) == 11
  copy.export_json(str(second))
  assert first.read_bytes() == second.read_bytes()
  data = json.loads(first.read_text())
  row = next(m for m in data["memories"] if m["id"] == ids[1])
  stored = np.frombuffer(conn.execute("SELECT c_emb FROM memories WHERE id = ?",
                                      (ids[1],)).fetchone()[0], np.float32)
  assert np.array_equal(np.asarray(row["caption_embedding"], np.float32), stored)
  assert copy.get_skill("property/text-only") == bank.get_skill("property/text-only")
  for q in ("question 3", "question 4"):
    a = bank.retrieve(q, category="property", k=4)
    b = copy.retrieve(q, category="property", k=4)
    assert a == b
  assert copy.add("new", "s", True, category="property").id == ids[-1] + 1

  with pytest.raises(MemoryBankError, match="the bank is not empty"):
    copy.import_json(str(first))
  assert copy.import_json(str(first), replace=True) == 11 and len(copy) == 11


def test_import_rejects_bad_files(tmp_path):
  bank = _bank(tmp_path)
  bank.add(Q, "s", True, category="time")
  path = tmp_path / "x.json"
  bank.export_json(str(path))
  good = json.loads(path.read_text())
  fresh = _bank(tmp_path, name="fresh.db")

  def check(data, match):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(MemoryBankError, match=match):
      fresh.import_json(str(path))
    assert len(fresh) == 0

  check("{not json", "cannot read a memory export")
  check({"format": "other"}, "not a memory export")
  bad = json.loads(json.dumps(good))
  bad["memories"][0]["outcome"] = "right"
  check(bad, r"memories\[0\]\.outcome must be one of .*got 'right'")
  bad = json.loads(json.dumps(good))
  bad["memories"][0]["question_embedding"] = [1.0, 2.0]
  check(bad, r"memories\[0\]\.question_embedding must be a list of 32 numbers")
  bad = json.loads(json.dumps(good))
  bad["memories"][0]["category"] = "weather"
  check(bad, r"memories\[0\]\.category must be one of .*got 'weather'")


def test_planner_context_layout(tmp_path):
  bank = _bank(tmp_path)
  bank.add("when was the tower built", "1. search the tower", True, category="time")
  bank.add("when was the tower opened", "1. guess", False, category="time",
           caption="an old photo")
  bank.add("when was the bridge built", "1. search", False, category="time")
  ctx = bank.planner_context("when was the tower finished", category="time")
  assert ctx.skill is None and ctx.gamma == 0.0 and len(ctx.memory_ids) == 2
  assert ctx.text == (
      "### Retrieved Relevant Memories:\n"
      "\n#### Positive Examples (Successful Strategies - 1):\n"
      "\n--- Example 1 (Text-only modality) ---\n- Judgement: correct\n"
      "- Question: when was the tower built\n- Workflow Summary: 1. search the tower\n"
      "\n#### Negative Examples (Failure Lessons - 1):\n"
      "\n--- Example 1 (Text-only modality) ---\n- Judgement: incorrect\n"
      "- Question: when was the bridge built\n- Workflow Summary: 1. search")
  bare = bank.planner_context("when was the tower finished", category="time",
                              use_memories=False)  # the no-memory ablation: routed, none shown
  assert bare.memory_ids == () and bare.bucket == ctx.bucket and "None found" in bare.text
  pictured = bank.planner_context("when was the tower opened", "a photo", category="time")
  assert pictured.text.endswith("--- Example 1 (Image-Text modality) ---\n- Judgement: incorrect\n"
                                "- Question: when was the tower opened\n"
                                "- Image Caption: an old photo\n- Workflow Summary: 1. guess")


def test_backup_is_a_consistent_copy_the_bank_goes_on_without(tmp_path):
  bank = _bank(tmp_path)
  bank.add(Q, "1. search", True, category="time")
  path = bank.backup(str(tmp_path / "snap" / "before.db"))  # folder made
  bank.add("who built the tower", "1. search", False, category="human")
  with pytest.raises(MemoryBankError, match="the bank's own file"):
    bank.backup(bank.path)
  with MemoryBank(path, HashEmbedder()) as copy:
    assert len(copy) == 1 and copy.memories("time/text-only")[0].question == Q
    assert copy.retrieve(Q, category="time").memory_ids == bank.retrieve(
        Q, category="time").memory_ids
  assert len(bank) == 2
  assert bank.backup(path) == path  # replaces the older copy
  with MemoryBank(path, HashEmbedder()) as copy:
    assert len(copy) == 2


def test_snapshot_and_restore_snapshot(tmp_path):
  """A snapshot is the bank at that moment; restoring it (checked by sha256) puts the bank's
  whole contents back in the open bank; a damaged one is refused and the bank left alone."""
  from apex_jax.memory.schema import MemoryBankDatabaseError
  from tests.apex.memory.fakes import HashEmbedder

  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(16))
  bank.add("what is a", "did x", True, category="time", modality="text-only")
  sha = bank.snapshot(str(tmp_path / "s.db"))
  bank.add("what is b", "did y", False, category="time", modality="text-only")
  bank.distiller_errors["no_json"] += 1
  counts = bank.counters_state()
  assert len(bank) == 2 and sorted(os.listdir(tmp_path))[-1] == "s.db"  # no temporaries left
  bank.restore_snapshot(str(tmp_path / "s.db"), sha)
  assert len(bank) == 1 and not bank.retrieve("what is b", category="time",
                                              modality="text-only").incorrect
  bank.load_counters_state(counts)
  assert bank.distiller_errors == {"no_json": 1}
  with open(tmp_path / "s.db", "r+b") as f:
    f.seek(100)
    f.write(b"\xff")
  bank.add("what is c", "did z", False, category="time", modality="text-only")
  with pytest.raises(MemoryBankDatabaseError, match="does not match its sha256"):
    bank.restore_snapshot(str(tmp_path / "s.db"), sha)
  assert len(bank) == 2
  bank.close()
