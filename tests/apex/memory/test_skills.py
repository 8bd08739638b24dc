"""Skill confidence, the evolution trigger, Distiller replies (applied or rejected), routing."""

import json
import re

import numpy as np
import pytest

from apex_jax.memory import (ERROR_KINDS, CentroidClassifier, DistillerError, LLMClassifier,
                             MemoryBank, MemoryConfig, confidence, extract_json_object,
                             format_batch, modality_of, parse_category)
from tests.apex.memory.fakes import HashEmbedder

B = ("location", "text-only")


def _bank(tmp_path, **config):
  return MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig(**config))


def _fill(bank, n, start=0, correct=lambda i: True):
  return [bank.add(f"where is place number {i} xq{i}", f"1. search {i}", correct(i),
                   category="location").id for i in range(start, start + n)]


def _reply(op="synthesize", absorbed=(), **skill):
  doc = {"skill_name": "location_text-only_strategy", "category": "location",
         "modality": "text-only", "description": "Find where a place is.",
         "procedure": [{"step": 1, "action": "Search the place name", "purpose": "candidates"},
                       {"step": 2, "action": "Verify with a map source", "purpose": "certainty"}],
         "pitfalls": ["Similar place names"], "win_rate": 0.5, "version": 1,
         "evidence_count": 3}
  doc.update(skill)
  return json.dumps({"operation": op, "skill": doc, "absorbed_ids": list(absorbed)})


def test_confidence_formula_and_threshold():
  # gamma = w min(n / 10, 1)
  assert confidence(0.8, 5) == pytest.approx(0.4)
  assert confidence(0.8, 25) == pytest.approx(0.8)
  assert confidence(1.0, 1) == pytest.approx(0.1)   # not > 0.1: not shown
  assert confidence(0.0, 50) == 0.0
  assert confidence(0.5, 3, n_full=3) == pytest.approx(0.5)


def test_skill_enters_planner_context_only_above_gamma(tmp_path):
  bank = _bank(tmp_path)
  ids = _fill(bank, 3, correct=lambda i: i == 0)                 # 1 of 3 correct
  assert bank.apply_distiller_reply(B, _reply(absorbed=ids[:1])).applied
  # w = 1/3, n = 3: gamma = 1/3 * 3/10 = 0.1, not > 0.1
  assert bank.skill_confidence(B) == pytest.approx(0.1)
  ctx = bank.planner_context("where is place number 1", category="location")
  assert ctx.skill is None and "Skill Guidance" not in ctx.text
  _fill(bank, 5, start=3)                                        # 5 new, all correct
  assert bank.apply_distiller_reply(B, _reply("refine", absorbed=ids[1:2])).applied
  # refine: evidence 3 + 5 = 8, correct 1 + 5 = 6: gamma = 6/8 * 8/10 = 0.6
  assert bank.skill_confidence(B) == pytest.approx(0.6)
  ctx = bank.planner_context("where is place number 1", category="location")
  assert ctx.skill is not None and ctx.gamma == pytest.approx(0.6)
  assert ctx.text.startswith(
      "### [Matched Skill Guidance] (category: location, modality: text-only, confidence: "
      "0.60)\n**Recommended Procedure:**\n"
      "1. Search the place name — candidates\n2. Verify with a map source — certainty\n\n"
      "**Known Pitfalls to Avoid:**\n- Similar place names\n\n### Retrieved Relevant Memories:")


def test_evolution_trigger_counts_new_memories(tmp_path):
  bank = _bank(tmp_path)                                   # every 5, min size 3, window 15
  _fill(bank, 4)
  assert not bank.due_for_evolution(B)
  _fill(bank, 1, start=4)
  assert bank.due_for_evolution(B)
  bank.apply_distiller_reply(B, '{"operation": "skip"}')  # no skill yet: only marks evolved
  assert not bank.due_for_evolution(B) and bank.get_skill(B) is None
  _fill(bank, 4, start=5)
  old = "where is place number 0 xq0"                      # stored before the evolution
  assert bank.add(old, "1. look 0", True, category="location").action == "dropped"
  assert not bank.due_for_evolution(B)                     # a dropped duplicate is not new
  assert bank.add(old, "0", True, category="location").action == "replaced"
  assert bank.due_for_evolution(B)                         # its shorter replacement is
  bank.mark_evolved(B)
  assert not bank.due_for_evolution(B)
  _fill(bank, 16, start=20)
  batch = bank.evolution_batch(B)
  assert len(batch) == 15 and [m.id for m in batch] == sorted(m.id for m in batch)
  assert batch[-1].question.endswith("xq35")
  assert format_batch(batch[:1]) == (f"Memory {batch[0].id} [CORRECT]:\n"
                                     f"  Question: {batch[0].question}\n"
                                     f"  Workflow: {batch[0].workflow_summary}")


def test_evolution_needs_min_bucket_size(tmp_path):
  bank = _bank(tmp_path, evolve_every=2, evolve_min_size=3)
  _fill(bank, 2)
  assert not bank.due_for_evolution(B)                    # 2 new, but only 2 memories
  _fill(bank, 1, start=2)
  assert bank.due_for_evolution(B)


def test_distiller_operations_and_history(tmp_path):
  bank = _bank(tmp_path)
  ids = _fill(bank, 4, correct=lambda i: i % 2 == 0)       # 2 of 4 correct
  res = bank.apply_distiller_reply(B, "Here you go:\n```json\n" + _reply(absorbed=[ids[0]]) +
                                   "\n```\nHope it helps.")
  assert res.applied and res.operation == "synthesize"
  s1 = bank.get_skill(B)
  assert (s1.version, s1.evidence_count, s1.correct_count, s1.absorbed_ids) == (1, 4, 2,
                                                                                 (ids[0],))
  assert s1.procedure[1].action == "Verify with a map source"

  _fill(bank, 2, start=4, correct=lambda i: False)
  res = bank.apply_distiller_reply(B, "skip it: {\"operation\": \"skip\"}")
  s2 = bank.get_skill(B)
  assert res.operation == "skip" and s2.version == 1 and (s2.evidence_count,
                                                          s2.correct_count) == (6, 2)

  new = _fill(bank, 3, start=6)
  res = bank.apply_distiller_reply(B, _reply("refine", absorbed=[str(new[0])],
                                             pitfalls=["Similar names", "Stale maps"]))
  s3 = bank.get_skill(B)
  assert (s3.version, s3.evidence_count, s3.correct_count) == (2, 9, 5)
  assert s3.pitfalls == ("Similar names", "Stale maps") and s3.operation == "refine"

  res = bank.apply_distiller_reply(B, _reply("create", absorbed=[], description="Other way."))
  s4 = bank.get_skill(B)
  # create: a fresh skill whose evidence is the batch (the bucket's last 9 memories, 5 correct)
  assert (s4.version, s4.evidence_count, s4.correct_count, s4.description) == (
      3, 9, 5, "Other way.")
  assert [s.version for s in bank.skill_history(B)] == [1, 2, 3]
  assert bank.skill_history(B)[0] == s1


BAD_REPLIES = [
    ("not_json", "I think the current skill is fine.", "holds no JSON object"),
    ("not_json", "```json\n{\"operation\": \"refine\",}\n```", "holds no JSON object"),
    ("missing_field", json.dumps({"skill": {}, "absorbed_ids": []}), "missing field 'operation'"),
    ("missing_field", _reply(description=None).replace('"description": null, ', ""),
     "skill: missing field 'description'"),
    ("missing_field", json.dumps({"operation": "refine", "skill": json.loads(_reply())["skill"]}),
     "missing field 'absorbed_ids'"),
    ("wrong_type", _reply(procedure="search, then verify"),
     "field 'procedure' must be list; got 'search, then verify'"),
    ("wrong_type", _reply(procedure=[{"step": "one", "action": "a", "purpose": "p"}]),
     r"skill.procedure\[0\]: field 'step' must be an integer; got 'one'"),
    ("wrong_type", _reply(pitfalls=["ok", 7]), r"pitfalls\[1\] must be a string; got 7"),
    ("wrong_type", _reply(win_rate="high"), "field 'win_rate' must be int or float; got 'high'"),
    ("bad_value", _reply(op="delete"), "field 'operation' must be one of .*got 'delete'"),
    ("bad_value", _reply(win_rate=1.5), r"field 'win_rate' must be in \[0, 1\]; got 1.5"),
    ("bad_value", _reply(procedure=[]), "field 'procedure' must not be empty"),
    ("wrong_type", _reply(absorbed=[True]), r"absorbed_ids\[0\] must be an id; got True"),
    ("wrong_type", _reply(absorbed=["x", 1.5]), r"absorbed_ids\[1\] must be an id; got 1.5"),
    ("wrong_type", _reply(absorbed=[{"id": 1}]), r"absorbed_ids\[0\] must be an id; got \{"),
    ("wrong_type", _reply("skip", absorbed=[None]), r"absorbed_ids\[0\] must be an id; got None"),
    ("wrong_type", _reply(category=7), "field 'category' must be str; got 7"),
    ("wrong_type", _reply(modality=["text-only"]), "field 'modality' must be str; got"),
]


@pytest.mark.parametrize("kind,reply,match", BAD_REPLIES)
def test_bad_distiller_reply_changes_nothing(tmp_path, kind, reply, match):
  bank = _bank(tmp_path)
  ids = _fill(bank, 5)
  bank.apply_distiller_reply(B, _reply(absorbed=ids[:2]))
  before, history = bank.get_skill(B), bank.skill_history(B)
  _fill(bank, 5, start=5)
  res = bank.apply_distiller_reply(B, reply)
  assert not res.applied and res.error.kind == kind and res.skill == before
  assert re.search(match, str(res.error))
  assert bank.get_skill(B) == before and bank.skill_history(B) == history
  assert bank.distiller_errors == {kind: 1}
  assert bank.due_for_evolution(B)                       # still due: nothing was distilled
  with pytest.raises(DistillerError, match=match) as err:
    bank.apply_distiller_reply(B, reply, strict=True)
  assert err.value.kind == kind and bank.distiller_errors[kind] == 2
  assert bank.get_skill(B) == before


def test_unknown_absorbed_ids_are_dropped_and_counted(tmp_path):
  # The authors' code never reads absorbed_ids: an id outside the batch shown is dropped (never
  # stored, never touching a real memory) and the rest of the reply is still applied.
  bank = _bank(tmp_path)
  ids = _fill(bank, 5)
  outside = _fill(bank, 1, start=5, correct=lambda i: False)[0]  # a real memory, not shown
  batch = bank.evolution_batch(B)[:4]
  assert outside not in [m.id for m in batch]
  res = bank.apply_distiller_reply(B, _reply(absorbed=[ids[0], 99999, str(outside), " 99999"]),
                                   batch=batch)
  assert res.applied and res.error is None and res.unknown_absorbed_ids == 2
  assert bank.get_skill(B).absorbed_ids == (ids[0],)
  assert bank.unknown_absorbed_ids == 2 and not bank.distiller_errors
  assert [m.correct for m in bank.memories(B)][-1] is False       # the outside memory untouched
  # skip with only unknown ids: applied (marks evolved), the ids counted
  _fill(bank, 5, start=6)
  res = bank.apply_distiller_reply(B, json.dumps({"operation": "skip", "absorbed_ids": ["m-7"]}))
  assert res.applied and res.operation == "skip" and res.unknown_absorbed_ids == 1
  assert bank.unknown_absorbed_ids == 3 and not bank.due_for_evolution(B)
  # a reply rejected for another reason counts its error, not its unknown ids
  res = bank.apply_distiller_reply(B, _reply(absorbed=[99999], procedure=[]))
  assert not res.applied and res.error.kind == "bad_value" and res.unknown_absorbed_ids == 0
  assert bank.unknown_absorbed_ids == 3 and bank.distiller_errors == {"bad_value": 1}


def test_another_buckets_category_is_overwritten_and_counted(tmp_path):
  # The bucket asked about is the truth: the authors' skill_repository.py
  # (evolve_skills_with_writer) sets new_skill_data["category"] / ["modality"] to the bucket's
  # whatever the Writer said, so such a reply is applied and stored under the asked bucket.
  bank = _bank(tmp_path)
  human = ("human", "text-only")
  ids = [bank.add(f"who founded company {i} xq{i}", f"1. search {i}", True,
                  category="human").id for i in range(3)]
  res = bank.apply_distiller_reply(human, _reply(absorbed=ids[:1]))  # says category 'location'
  assert res.applied and res.error is None and res.bucket_overwrites == 1
  skill = bank.get_skill(human)
  assert res.skill == skill and (skill.category, skill.modality) == human
  assert skill.absorbed_ids == (ids[0],) and skill.evidence_count == 3
  assert bank.get_skill(B) is None                       # nothing stored under 'location'
  assert bank.bucket_overwrites == 1 and not bank.distiller_errors
  assert not bank.due_for_evolution(human)
  # both fields wrong: two overwrites; case / spaces alone are not one
  _fill(bank, 3)
  res = bank.apply_distiller_reply(B, _reply(category=" Human", modality="text-image"))
  assert res.applied and res.bucket_overwrites == 2
  assert (bank.get_skill(B).category, bank.get_skill(B).modality) == B
  res = bank.apply_distiller_reply(B, _reply("refine", category=" LOCATION ", modality="Text-Only"))
  assert res.applied and res.bucket_overwrites == 0 and bank.get_skill(B).version == 2
  assert bank.bucket_overwrites == 3 and not bank.distiller_errors
  # a reply rejected for another reason counts its error, not its overwrite
  res = bank.apply_distiller_reply(B, _reply(category="human", procedure=[]))
  assert not res.applied and res.error.kind == "bad_value" and res.bucket_overwrites == 0
  assert bank.bucket_overwrites == 3 and bank.distiller_errors == {"bad_value": 1}


def test_every_error_kind_is_tested():
  assert {k for k, _, _ in BAD_REPLIES} == set(ERROR_KINDS)


def test_refine_without_a_skill_is_rejected(tmp_path):
  bank = _bank(tmp_path)
  _fill(bank, 3)
  res = bank.apply_distiller_reply(B, _reply("refine"))
  assert res.error.kind == "bad_value" and "has none" in str(res.error)
  assert bank.get_skill(B) is None


def test_extract_json_object():
  obj = {"operation": "skip", "note": "a {brace} inside"}
  text = json.dumps(obj)
  assert extract_json_object(text) == obj
  assert extract_json_object("Sure! {not json} and then " + text + " done.") == obj
  assert extract_json_object("<think>maybe {\"operation\": \"refine\"}</think>\n" + text) == obj
  assert extract_json_object("```\n[1, 2]\n```\n```json\n" + text + "\n```") == obj
  with pytest.raises(DistillerError, match="reply must be a string; got NoneType"):
    extract_json_object(None)
  # a list left open (a toy's reply; the decoder stops at the ":" after "win_rate"): the step
  # object inside it is not the reply
  broken = ('{"operation": "synthesize", "skill": {"procedure": [{"step": 1, "action": "a"}], '
            '"pitfalls": ["p", "win_rate": 0.5}, "absorbed_ids": [1]}')
  with pytest.raises(DistillerError, match=r"JSON object at char 0 does not parse: "
                                           r"Expecting ',' delimiter \(line 1 column 110\)"):
    extract_json_object(broken)
  assert extract_json_object('{"a": [1, } then ' + text) == obj  # closed before: not inside


def test_llm_classifier_parses_defensively():
  replies = iter(["Time", "**Location**", "<think>human or event?</think>\nEvent",
                  "The category is property.", "location or human", "no idea"])
  clf = LLMClassifier(lambda prompt: next(replies))
  assert [clf("q") for _ in range(6)] == ["time", "location", "event", "property", "others",
                                          "others"]
  assert clf.counts["unparsed"] == 2

  def fail(prompt):
    raise TimeoutError("server down")
  broken = LLMClassifier(fail)
  assert broken("q") == "others" and broken.counts["error"] == 1
  assert parse_category("'Career'") == "career" and parse_category("others") == "others"


def test_centroid_classifier_and_modality():
  clf = CentroidClassifier(HashEmbedder(), {"time": "when year date", "location": "where city"})
  assert clf("which year and date was it") == "time"
  assert clf("where is the city") == "location"
  assert modality_of("a photo") == "text-image" and modality_of("  ") == "text-only"
  assert modality_of(None, image=np.zeros((2, 2))) == "text-image"
