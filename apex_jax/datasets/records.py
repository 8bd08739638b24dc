"""The common question record of every APEx dataset, and the checks its loaders share.

A `QAExample` is one question with its gold answers (aliases; empty for unlabelled test sets),
its memory category (one of `apex_jax.memory.CATEGORIES`), its hop count, its supporting facts
(title, sentence index) where the dataset gives them, and the passages that come with it
(HotpotQA / 2WikiMultiHopQA: the context paragraphs, distractors included; the synthetic world:
the gold passages). The synthetic world also gives the gold hop chain (`chain`): for each hop the
search query, the passage that answers it and the answer, so executor turns can be written from it.
An image question (the MIA data's image rows, `image_qa`) also carries its images as the file
gives them (base64 or data URLs; the first is the question's, decoded by `image_qa.image_of`)
and its caption (which routes its memories to the text-image bucket; the planner reads it).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from apex_jax.memory.schema import CATEGORIES
from apex_jax.tools.passages import Passage


class DatasetError(ValueError):
  """Input a loader cannot use; the message names the file, the record and the field."""


@dataclasses.dataclass(frozen=True)
class SupportingFact:
  title: str
  sentence: int  # index into the paragraph's sentences


@dataclasses.dataclass(frozen=True)
class Hop:
  """One retrieval step of a gold chain: searching `query` finds passage `passage_id` (titled
  `title`), whose text contains `answer`."""
  query: str
  passage_id: str
  title: str
  answer: str


@dataclasses.dataclass(frozen=True)
class QAExample:
  id: str
  question: str
  answers: tuple[str, ...]
  category: str
  hops: int
  supporting: tuple[SupportingFact, ...] | None = None
  passages: tuple[Passage, ...] = ()
  kind: str = ""  # the dataset's own question type (HotpotQA 'bridge', world 'chain', ...)
  level: str = ""  # HotpotQA's difficulty level
  evidences: tuple[tuple[str, str, str], ...] = ()  # 2WikiMultiHopQA's (subject, relation, object)
  chain: tuple[Hop, ...] = ()
  images: tuple[str, ...] = ()  # base64 / data URLs as the file gives them (image questions)
  caption: str | None = None  # the question image's caption

  def __post_init__(self):
    for name in ("id", "question"):
      value = getattr(self, name)
      if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"QAExample.{name} must be a non-empty string; got {value!r}")
    if not isinstance(self.answers, tuple) or not all(isinstance(a, str) for a in self.answers):
      raise DatasetError(f"QAExample.answers must be a tuple of strings; got {self.answers!r}")
    if self.category not in CATEGORIES:
      raise DatasetError(f"QAExample.category must be one of {', '.join(CATEGORIES)}; got "
                         f"{self.category!r}")
    if isinstance(self.hops, bool) or not isinstance(self.hops, int) or self.hops < 1:
      raise DatasetError(f"QAExample.hops must be an integer >= 1; got {self.hops!r}")
    if not isinstance(self.images, tuple) or not all(isinstance(x, str) for x in self.images):
      raise DatasetError(f"QAExample.images must be a tuple of strings; got {self.images!r:.80}")
    if self.caption is not None and not isinstance(self.caption, str):
      raise DatasetError(f"QAExample.caption must be a string or None; got {self.caption!r}")
    if self.chain and len(self.chain) != self.hops:
      raise DatasetError(f"QAExample.hops is {self.hops} but the chain has {len(self.chain)} "
                         f"hops (id {self.id!r})")

  @property
  def labelled(self) -> bool:
    return bool(self.answers)


# ---- shared parsing of the official JSON files -----------------------------------------------


def read_json_list(path: str) -> list:
  """The top-level JSON array of an official dataset file."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise DatasetError(f"{path}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") \
        from None
  if not isinstance(data, list):
    raise DatasetError(f"{path}: expected a JSON array of records, got {type(data).__name__}")
  return data


class Where:
  """'file: record i (_id ...)' for error messages."""

  def __init__(self, path: str, index: int, row: Any):
    rid = row.get("_id") if isinstance(row, dict) else None
    self.prefix = f"{path}: record {index}" + (f" (_id {rid!r})" if isinstance(rid, str) else "")

  def error(self, field: str, message: str) -> DatasetError:
    return DatasetError(f"{self.prefix}: field {field!r} {message}")


def short(value: Any, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def field_str(row: dict, field: str, where: Where, required: bool = True) -> str | None:
  if field not in row:
    if required:
      raise where.error(field, "is missing")
    return None
  value = row[field]
  if not isinstance(value, str) or not value.strip():
    raise where.error(field, f"must be a non-empty string, got {short(value)}")
  return value


def context_passages(row: dict, where: Where) -> tuple[Passage, ...]:
  """`context: [[title, [sentence, ...]], ...]` -> passages with id = title, text = the
  stripped sentences joined by one space (HotpotQA's sentences carry their own leading space,
  2WikiMultiHopQA's do not; stripping makes both read the same)."""
  if "context" not in row:
    raise where.error("context", "is missing")
  context = row["context"]
  if not isinstance(context, list):
    raise where.error("context", f"must be a list of [title, sentences] pairs, got "
                      f"{short(context)}")
  out = []
  for j, item in enumerate(context):
    if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
        or not isinstance(item[1], list) or not all(isinstance(s, str) for s in item[1])):
      raise where.error(f"context[{j}]", f"must be [title, [sentence, ...]], got {short(item)}")
    title, sentences = item
    text = " ".join(s.strip() for s in sentences if s.strip())
    out.append(Passage(title, f'"{title}"\n{text}'))
  return tuple(out)


def supporting_facts(row: dict, where: Where) -> tuple[SupportingFact, ...] | None:
  """`supporting_facts: [[title, sentence_index], ...]`, or None where the split has none."""
  if "supporting_facts" not in row:
    return None
  facts = row["supporting_facts"]
  if not isinstance(facts, list):
    raise where.error("supporting_facts", f"must be a list of [title, sentence] pairs, got "
                      f"{short(facts)}")
  out = []
  for j, item in enumerate(facts):
    if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
        or isinstance(item[1], bool) or not isinstance(item[1], int) or item[1] < 0):
      raise where.error(f"supporting_facts[{j}]", f"must be [title, sentence index >= 0], got "
                        f"{short(item)}")
    out.append(SupportingFact(item[0], item[1]))
  return tuple(out)


def distinct_titles(facts: Sequence[SupportingFact]) -> int:
  return len({f.title for f in facts})
