"""Corpus export and the JSONL layout of question sets.

`to_corpus` writes the union of the examples' passages as the Search-R1 / FlashRAG corpus that
`launchers/build_index.py` reads: one `{"id": "<n>", "contents": "\\"Title\\"\\ntext"}` per line.

A question set is JSONL, one example per line:
  {"id", "question", "answers": [str], "category", "hops", "kind", "level",
   "supporting": [[title, sentence]] | null, "evidences": [[s, r, o]],
   "chain": [{"query", "passage_id", "title", "answer"}], "passage_ids": [str]}
Passages are stored once, in the corpus, and referred to by id.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Iterable, Mapping, Sequence

from apex_jax.datasets.records import DatasetError, Hop, QAExample, SupportingFact
from apex_jax.tools.passages import Passage, read_corpus


def _atomic_lines(path: str, rows: Iterable[dict]) -> int:
  """Writes JSON lines to a temp file beside `path` and renames it over `path`."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp")
  count = 0
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        count += 1
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  return count


def to_corpus(examples: Sequence[QAExample], path: str) -> dict:
  """Writes the examples' passages, deduplicated by title (the first text seen for a title wins),
  with ids "0", "1", ... in order of first appearance. Returns {"passages", "duplicates",
  "conflicts"}: repeats of a title with the same text, and with a different text."""
  seen: dict[str, str] = {}
  duplicates = conflicts = 0
  for example in examples:
    for passage in example.passages:
      if passage.title not in seen:
        seen[passage.title] = passage.text
      elif seen[passage.title] == passage.text:
        duplicates += 1
      else:
        conflicts += 1
  rows = ({"id": str(i), "contents": f'"{title}"\n{text}'} for i, (title, text) in
          enumerate(seen.items()))
  return {"passages": _atomic_lines(path, rows), "duplicates": duplicates, "conflicts": conflicts}


def write_passages(passages: Sequence[Passage], path: str) -> int:
  """Passages with their own ids, as corpus JSONL."""
  return _atomic_lines(path, (p.document() for p in passages))


def example_row(example: QAExample) -> dict:
  return {
      "id": example.id, "question": example.question, "answers": list(example.answers),
      "category": example.category, "hops": example.hops, "kind": example.kind,
      "level": example.level,
      "supporting": (None if example.supporting is None else
                     [[f.title, f.sentence] for f in example.supporting]),
      "evidences": [list(e) for e in example.evidences],
      "chain": [{"query": h.query, "passage_id": h.passage_id, "title": h.title,
                 "answer": h.answer} for h in example.chain],
      "passage_ids": [p.id for p in example.passages]}


def write_examples(examples: Sequence[QAExample], path: str) -> int:
  return _atomic_lines(path, (example_row(e) for e in examples))


def _example(row, where: str, passages: Mapping[str, Passage]) -> QAExample:
  if not isinstance(row, dict):
    raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
  for field in ("id", "question", "answers", "category", "hops", "passage_ids"):
    if field not in row:
      raise DatasetError(f"{where}: field {field!r} is missing")
  try:
    missing = [pid for pid in row["passage_ids"] if pid not in passages]
    if missing:
      raise DatasetError(f"field 'passage_ids' names {missing[0]!r}, which is not in the corpus")
    return QAExample(
        id=row["id"], question=row["question"], answers=tuple(row["answers"]),
        category=row["category"], hops=row["hops"],
        supporting=(None if row.get("supporting") is None else
                    tuple(SupportingFact(t, s) for t, s in row["supporting"])),
        passages=tuple(passages[pid] for pid in row["passage_ids"]),
        kind=row.get("kind", ""), level=row.get("level", ""),
        evidences=tuple(tuple(e) for e in row.get("evidences", [])),
        chain=tuple(Hop(**h) for h in row.get("chain", [])))
  except DatasetError as e:
    raise DatasetError(f"{where}: {e}") from None
  except (TypeError, ValueError) as e:  # wrong shapes inside lists or hop objects
    raise DatasetError(f"{where}: malformed field value ({e})") from None


def read_examples(path: str, corpus: str | Mapping[str, Passage]) -> list[QAExample]:
  """The examples of a question-set JSONL, with their passages looked up in `corpus` (a corpus
  JSONL path or an id -> Passage map). Errors name FILE:LINE and the field."""
  passages = corpus if isinstance(corpus, Mapping) else {p.id: p for p in read_corpus(corpus)}
  out = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
      out.append(_example(row, where, passages))
  return out
