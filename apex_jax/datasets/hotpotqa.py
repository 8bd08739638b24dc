"""HotpotQA (Yang et al. 2018) from its official JSON files.

A file is one JSON array of records
  {"_id", "question", "answer", "supporting_facts": [[title, sent_id], ...],
   "context": [[title, [sentence, ...]], ...], "type": "bridge" | "comparison", "level"}
(hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json, hotpot_dev_fullwiki_v1.json); the test
file (hotpot_test_fullwiki_v1.json) has only _id, question and context.

hops = the number of distinct supporting titles (2 in every labelled HotpotQA question), or 2
(the dataset's design) where the split has no supporting facts. The whole file is checked before
anything is returned: a bad record raises `DatasetError` naming the file, the record index, its
_id and the field.
"""

from __future__ import annotations

from apex_jax.datasets import categories
from apex_jax.datasets.records import (QAExample, Where, context_passages, distinct_titles,
                                       field_str, read_json_list, supporting_facts)

NOMINAL_HOPS = 2


def parse_record(row, where: Where, classify: categories.Classifier) -> QAExample:
  if not isinstance(row, dict):
    raise where.error("(record)", f"must be a JSON object, got {type(row).__name__}")
  qid = field_str(row, "_id", where)
  question = field_str(row, "question", where)
  answer = row.get("answer")
  if answer is not None and not isinstance(answer, str):
    raise where.error("answer", f"must be a string, got {answer!r}")
  facts = supporting_facts(row, where)
  for name in ("type", "level"):
    if name in row and not isinstance(row[name], str):
      raise where.error(name, f"must be a string, got {row[name]!r}")
  return QAExample(
      id=qid, question=question, answers=(answer,) if answer else (),
      category=categories.checked(classify, question, where.prefix),
      hops=distinct_titles(facts) if facts else NOMINAL_HOPS, supporting=facts,
      passages=context_passages(row, where), kind=row.get("type", ""),
      level=row.get("level", ""))


def load(path: str, classify: categories.Classifier = categories.keyword_category,
         limit: int | None = None) -> list[QAExample]:
  """The first `limit` (default all) records of an official HotpotQA JSON file, in file order."""
  rows = read_json_list(path)
  rows = rows if limit is None else rows[:limit]
  return [parse_record(row, Where(path, i, row), classify) for i, row in enumerate(rows)]
