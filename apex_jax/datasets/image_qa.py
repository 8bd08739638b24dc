"""Image questions in the MIA data's layout (ECNU-SII/MIA: the paper's InfoSeek, LiveVQA,
MMSearch, SimpleVQA and the MIA image part), as its inference reads them
(Inference/*/run_multi_react.py, react_agent.py; run.sh's DATASET=.../fvqa_test.jsonl):

  a .jsonl file (one object a line) or a .json file (an array), each record
  {"question": str, "answer": str | [str, ...], "ids": str (the image-search cache folder),
   "images": [base64 or "data:image...;base64,..." text, ...] (the first is the question's),
   "image_caption": [str, ...] | str}

`id` is read where `ids` is absent; answer, images and image_caption may be absent (an
unlabelled, a text-only or an uncaptioned question). A folder holds a split as `<split>.jsonl`,
`<split>.json` or one `*_<split>.jsonl|json` (fvqa_test.jsonl). Every image is decoded while
loading, so a damaged one stops the load with a `DatasetError` naming the file, the record and
the field; nothing is returned from a file with a bad record.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from apex_jax.datasets import categories
from apex_jax.datasets.records import (DatasetError, QAExample, Where, field_str, read_json_list,
                                       short)
from apex_jax.tools import images as images_lib

NOMINAL_HOPS = 1  # a visual question: recognise, then (maybe) look up one fact


def split_file(folder: str, split: str) -> str:
  """The file of `split` in a folder (see the module doc); FileNotFoundError names what was
  looked for, a ValueError names several candidates."""
  exact = [os.path.join(folder, f"{split}{ext}") for ext in (".jsonl", ".json")]
  found = [f for f in exact if os.path.isfile(f)]
  if not found:
    found = sorted(f for ext in (".jsonl", ".json")
                   for f in glob.glob(os.path.join(glob.escape(folder), f"*_{split}{ext}")))
  if not found:
    raise FileNotFoundError(f"{folder}: no {split}.jsonl, {split}.json or *_{split}.jsonl|json")
  if len(found) > 1:
    raise ValueError(f"{folder}: several files for split {split!r}: "
                     f"{[os.path.basename(f) for f in found]}; give the file itself")
  return found[0]


def read_rows(path: str) -> list:
  """The records of a .jsonl or .json file."""
  if not path.endswith(".jsonl"):
    return read_json_list(path)
  rows = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: line {n}: invalid JSON ({e.msg} at column {e.colno})") \
            from None
  return rows


def _answers(row: dict, where: Where) -> tuple[str, ...]:
  answer = row.get("answer")
  if answer is None or answer == "":
    return ()
  answers = [answer] if isinstance(answer, str) else answer
  if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
    raise where.error("answer", f"must be a string or a list of non-empty strings, got "
                      f"{short(answer)}")
  return tuple(answers)


def _id(row: dict, where: Where) -> str:
  key = "ids" if "ids" in row else "id"
  value = row.get(key)
  if isinstance(value, int) and not isinstance(value, bool):
    value = str(value)
  if not isinstance(value, str) or not value.strip():
    raise where.error(key, f"must be a non-empty string (the image-search cache id), got "
                      f"{short(value)}")
  return value


def _images(row: dict, where: Where) -> tuple[str, ...]:
  value = row.get("images", [])
  if not isinstance(value, list):
    raise where.error("images", f"must be a list of base64 images, got {short(value)}")
  for j, text in enumerate(value):
    try:
      images_lib.decode_base64(text, f"{where.prefix}: field 'images[{j}]'")
    except images_lib.ImageError as e:
      raise DatasetError(str(e)) from None
  return tuple(value)


def _caption(row: dict, where: Where) -> str | None:
  value = row.get("image_caption")
  first = value[0] if isinstance(value, list) and value else value
  if first in (None, []):
    return None
  if not isinstance(first, str):
    raise where.error("image_caption", f"must be a string or a list of strings, got "
                      f"{short(value)}")
  return first if first.strip() else None


def parse_record(row, where: Where, classify: categories.Classifier) -> QAExample:
  if not isinstance(row, dict):
    raise where.error("(record)", f"must be a JSON object, got {type(row).__name__}")
  question = field_str(row, "question", where)
  return QAExample(id=_id(row, where), question=question, answers=_answers(row, where),
                   category=categories.checked(classify, question, where.prefix),
                   hops=NOMINAL_HOPS, kind="image" if row.get("images") else "text",
                   images=_images(row, where), caption=_caption(row, where))


def load(path: str, classify: categories.Classifier = categories.keyword_category,
         limit: int | None = None) -> list[QAExample]:
  """The first `limit` (default all) records of an image-question file, in file order."""
  rows = read_rows(path)
  rows = rows if limit is None else rows[:limit]
  return [parse_record(row, Where(path, i, row), classify) for i, row in enumerate(rows)]


def image_of(example: QAExample) -> np.ndarray | None:
  """The question's image (its first), decoded for the executor: uint8 [448, 448, 3]."""
  if not example.images:
    return None
  return images_lib.decode_base64(example.images[0], f"question {example.id!r} images[0]")


def episode_inputs(examples) -> dict:
  """run_episode's image arguments for a batch of examples: captions (memories, retrieval and
  the planner), images (decoded, the executor's first turn) and data_ids (the image-search
  cache ids, for the questions that have an image)."""
  return dict(captions=[e.caption for e in examples], images=[image_of(e) for e in examples],
              data_ids=[e.id if e.images else None for e in examples])
