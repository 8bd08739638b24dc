"""2WikiMultiHopQA (Ho et al. 2020) from its official JSON files (train.json, dev.json, test.json).

A file is one JSON array of records
  {"_id", "type", "question", "context": [[title, [sentence, ...]], ...],
   "supporting_facts": [[title, sent_id], ...], "evidences": [[subject, relation, object], ...],
   "answer"}
with type one of comparison, inference, compositional, bridge_comparison; the test file has no
answer, supporting facts or evidences.

hops = the number of evidence triples (each is one fact to look up: 2 for comparison,
compositional and inference, 4 for bridge_comparison), else the distinct supporting titles, else
the type's nominal count. Errors name the file, the record index, its _id and the field; nothing
is returned from a file with a bad record.
"""

from __future__ import annotations

from apex_jax.datasets import categories
from apex_jax.datasets.records import (QAExample, Where, context_passages, distinct_titles,
                                       field_str, read_json_list, short,
                                       supporting_facts)

TYPES = ("comparison", "inference", "compositional", "bridge_comparison")
NOMINAL_HOPS = {"comparison": 2, "inference": 2, "compositional": 2, "bridge_comparison": 4}


def _evidences(row: dict, where: Where) -> tuple[tuple[str, str, str], ...]:
  value = row.get("evidences", [])
  if not isinstance(value, list):
    raise where.error("evidences", f"must be a list of [subject, relation, object], got "
                      f"{short(value)}")
  for j, item in enumerate(value):
    if not isinstance(item, list) or len(item) != 3 or not all(isinstance(x, str) for x in item):
      raise where.error(f"evidences[{j}]", f"must be [subject, relation, object] strings, got "
                        f"{short(item)}")
  return tuple(tuple(item) for item in value)


def parse_record(row, where: Where, classify: categories.Classifier) -> QAExample:
  if not isinstance(row, dict):
    raise where.error("(record)", f"must be a JSON object, got {type(row).__name__}")
  qid = field_str(row, "_id", where)
  question = field_str(row, "question", where)
  qtype = field_str(row, "type", where, required=False) or ""
  if qtype and qtype not in TYPES:
    raise where.error("type", f"must be one of {', '.join(TYPES)}, got {qtype!r}")
  answer = row.get("answer")
  if answer is not None and not isinstance(answer, str):
    raise where.error("answer", f"must be a string, got {answer!r}")
  facts = supporting_facts(row, where)
  evidences = _evidences(row, where)
  hops = (len(evidences) if evidences else
          distinct_titles(facts) if facts else NOMINAL_HOPS.get(qtype, 2))
  return QAExample(
      id=qid, question=question, answers=(answer,) if answer else (),
      category=categories.checked(classify, question, where.prefix), hops=hops,
      supporting=facts, passages=context_passages(row, where), kind=qtype, evidences=evidences)


def load(path: str, classify: categories.Classifier = categories.keyword_category,
         limit: int | None = None) -> list[QAExample]:
  """The first `limit` (default all) records of an official 2WikiMultiHopQA JSON file."""
  rows = read_json_list(path)
  rows = rows if limit is None else rows[:limit]
  return [parse_record(row, Where(path, i, row), classify) for i, row in enumerate(rows)]
