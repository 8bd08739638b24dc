"""HotpotQA and 2WikiMultiHopQA loaders on hand-written files in the official layouts."""

import json
import os

import pytest

from apex_jax.datasets import DatasetError, hotpotqa, to_corpus, twowiki
from apex_jax.memory import CentroidClassifier
from apex_jax.tools.passages import read_corpus
from tests.apex.memory.fakes import HashEmbedder

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
HOTPOT_DEV = os.path.join(FIXTURES, "hotpot_dev_distractor_sample.json")
HOTPOT_TEST = os.path.join(FIXTURES, "hotpot_test_fullwiki_sample.json")
TWOWIKI_DEV = os.path.join(FIXTURES, "twowiki_dev_sample.json")
TWOWIKI_TEST = os.path.join(FIXTURES, "twowiki_test_sample.json")


def test_hotpotqa_fields_hops_and_categories():
  examples = hotpotqa.load(HOTPOT_DEV)
  assert [e.id for e in examples] == ["5a8b57f25542995d1e6f1371", "5a8c7595554299585d9e36b6",
                                      "5a85ea095542994775f606a8"]
  first = examples[0]
  assert first.answers == ("yes",) and first.kind == "comparison" and first.level == "hard"
  assert [(f.title, f.sentence) for f in first.supporting] == [("Scott Derrickson", 0),
                                                               ("Ed Wood", 0)]
  assert [p.title for p in first.passages] == ["Ed Wood (film)", "Scott Derrickson", "Ed Wood"]
  # HotpotQA's sentences carry a leading space; joined with exactly one space between them
  assert first.passages[1].text == ("Scott Derrickson (born July 16, 1966) is an American "
                                    "director, screenwriter and producer. He lives in Los "
                                    "Angeles, California.")
  assert [e.hops for e in examples] == [2, 2, 2]  # distinct supporting titles
  assert [e.category for e in examples] == ["others", "career", "location"]


def test_hotpotqa_test_split_has_no_labels():
  examples = hotpotqa.load(HOTPOT_TEST)
  assert [e.answers for e in examples] == [(), ()]
  assert all(e.supporting is None and e.hops == hotpotqa.NOMINAL_HOPS for e in examples)
  assert [e.category for e in examples] == ["time", "property"]
  assert not examples[0].labelled


def test_twowiki_fields_hops_from_evidences():
  examples = twowiki.load(TWOWIKI_DEV)
  assert [e.kind for e in examples] == ["compositional", "comparison", "bridge_comparison",
                                        "inference"]
  assert [e.hops for e in examples] == [2, 2, 4, 3]
  assert examples[0].answers == ("Ma\u0142gorzata Braunek",)
  assert examples[0].evidences[1] == ("Xawery \u017bu\u0142awski", "mother",
                                      "Ma\u0142gorzata Braunek")
  assert [e.category for e in examples] == ["human", "others", "others", "location"]
  test = twowiki.load(TWOWIKI_TEST)
  assert test[0].answers == () and test[0].hops == 2 and test[0].category == "others"


def test_limit_and_custom_classifier():
  assert len(hotpotqa.load(HOTPOT_DEV, limit=2)) == 2
  centroid = CentroidClassifier(HashEmbedder(64))
  examples = twowiki.load(TWOWIKI_DEV, classify=centroid)
  assert [e.category for e in examples] == [centroid(e.question) for e in examples]
  with pytest.raises(DatasetError, match=r"record 0 .*classifier returned 'nonsense'"):
    hotpotqa.load(HOTPOT_DEV, classify=lambda q: "nonsense")


def test_corpus_export_round_trips_through_the_passage_reader(tmp_path):
  examples = hotpotqa.load(HOTPOT_DEV) + twowiki.load(TWOWIKI_DEV)
  path = str(tmp_path / "corpus.jsonl")
  stats = to_corpus(examples, path)
  passages = list(read_corpus(path))
  titles = [p.title for p in passages]
  assert len(titles) == len(set(titles)) == stats["passages"] == 18
  assert stats == {"passages": 18, "duplicates": 1, "conflicts": 0}  # "Ed Wood" twice
  assert [p.id for p in passages] == [str(i) for i in range(18)]
  by_title = {p.title: p for e in examples for p in e.passages}
  for p in passages:
    assert p.text == by_title[p.title].text
  raw = [json.loads(line) for line in open(path)]
  assert raw[0] == {"id": "0", "contents": passages[0].contents}


def test_corpus_counts_conflicting_texts_and_keeps_the_first(tmp_path):
  examples = hotpotqa.load(HOTPOT_DEV)
  changed = dict(json.load(open(HOTPOT_DEV))[2])
  changed["_id"], changed["context"] = "x1", [["Adriana Trigiani", ["Another text."]]]
  path = tmp_path / "changed.json"
  path.write_text(json.dumps([changed]))
  stats = to_corpus(examples + hotpotqa.load(str(path)), str(tmp_path / "c.jsonl"))
  assert stats["conflicts"] == 1
  texts = {p.title: p.text for p in read_corpus(str(tmp_path / "c.jsonl"))}
  assert texts["Adriana Trigiani"].startswith("Adriana Trigiani is an Italian American")


def _write(tmp_path, rows, name="bad.json"):
  path = tmp_path / name
  path.write_text(rows if isinstance(rows, str) else json.dumps(rows))
  return str(path)


def _hotpot_rows():
  return json.load(open(HOTPOT_DEV))


@pytest.mark.parametrize("edit,pattern", [
    (lambda r: r[1].pop("question"), r"record 1 \(_id '5a8c7595554299585d9e36b6'\): field "
                                     r"'question' is missing"),
    (lambda r: r[2].update(answer=7), r"record 2 .*field 'answer' must be a string, got 7"),
    (lambda r: r[0].update(context={"a": 1}), r"record 0 .*field 'context' must be a list"),
    (lambda r: r[0]["context"].append(["T", "not a list"]),
     r"record 0 .*field 'context\[3\]' must be \[title, \[sentence"),
    (lambda r: r[1]["supporting_facts"].append(["T", -1]),
     r"record 1 .*field 'supporting_facts\[3\]' must be \[title, sentence index >= 0\]"),
    (lambda r: r.__setitem__(1, ["not", "an", "object"]), r"record 1: field '\(record\)' must be "
                                                          r"a JSON object, got list"),
])
def test_hotpotqa_malformed_records_name_file_record_and_field(tmp_path, edit, pattern):
  rows = _hotpot_rows()
  edit(rows)
  path = _write(tmp_path, rows)
  with pytest.raises(DatasetError, match=f"^{path}: {pattern}"):
    hotpotqa.load(path)


@pytest.mark.parametrize("edit,pattern", [
    (lambda r: r[0].update(type="bridge"), r"record 0 .*field 'type' must be one of comparison"),
    (lambda r: r[2]["evidences"].append(["a", "b"]),
     r"record 2 .*field 'evidences\[4\]' must be \[subject, relation, object\]"),
    (lambda r: r[3].pop("_id"), r"record 3: field '_id' is missing"),
])
def test_twowiki_malformed_records(tmp_path, edit, pattern):
  rows = json.load(open(TWOWIKI_DEV))
  edit(rows)
  path = _write(tmp_path, rows)
  with pytest.raises(DatasetError, match=f"^{path}: {pattern}"):
    twowiki.load(path)


@pytest.mark.parametrize("text,pattern", [
    ('[{"_id": "a", ', r"invalid JSON \(.* at line 1 column"),
    ('{"data": []}', r"expected a JSON array of records, got dict"),
])
def test_bad_json_files(tmp_path, text, pattern):
  path = _write(tmp_path, text)
  for loader in (hotpotqa.load, twowiki.load):
    with pytest.raises(DatasetError, match=f"^{path}: {pattern}"):
      loader(path)


def test_categories_embedder_option_uses_centroids():
  from apex_jax.datasets import classifier, keyword_category
  assert classifier() is keyword_category
  rule = classifier(HashEmbedder(16))
  assert isinstance(rule, CentroidClassifier)
  assert rule("Who wrote it?") == CentroidClassifier(HashEmbedder(16))("Who wrote it?")
