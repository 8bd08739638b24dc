"""Image questions in the MIA data's layout: the loader, the array_record builders of the
paper's image benchmarks, and damaged rows named by file, record and field. Fixtures are tiny
images the tests write."""

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from apex_jax.datasets import image_qa, sources
from apex_jax.datasets.records import DatasetError


def b64(color) -> str:
  buffer = io.BytesIO()
  Image.new("RGB", (10, 6), color).save(buffer, "PNG")
  return base64.b64encode(buffer.getvalue()).decode()


ROWS = [
    {"question": "Which city is this building in?", "answer": "Paris", "ids": "fvqa_test_1",
     "images": [b64((200, 10, 10))], "image_caption": ["A tall iron tower."]},
    {"question": "Who painted it?", "answer": ["Monet", "Claude Monet"], "ids": 7,
     "images": ["data:image;base64," + b64((0, 90, 0))], "image_caption": "Water lilies."},
    {"question": "What year did the war end?", "ids": "t3"},  # text-only, unlabelled
]


def write(path, rows, jsonl=True):
  with open(path, "w", encoding="utf-8") as f:
    if jsonl:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    else:
      json.dump(rows, f)
  return str(path)


def test_rows_become_examples_with_images_and_captions(tmp_path):
  a, b, c = image_qa.load(write(tmp_path / "x_test.jsonl", ROWS))
  assert (a.id, a.answers, a.caption, a.kind, a.hops) == (
      "fvqa_test_1", ("Paris",), "A tall iron tower.", "image", 1)
  assert (b.id, b.answers, b.caption) == ("7", ("Monet", "Claude Monet"), "Water lilies.")
  assert (c.images, c.caption, c.answers, c.kind) == ((), None, (), "text")
  image = image_qa.image_of(a)
  assert image.shape == (448, 448, 3) and image.dtype == np.uint8
  np.testing.assert_array_equal(image[100, 100], [200, 10, 10])
  np.testing.assert_array_equal(image_qa.image_of(b)[0, 0], [0, 90, 0])
  assert image_qa.image_of(c) is None
  assert image_qa.load(write(tmp_path / "y.json", ROWS, jsonl=False)) == [a, b, c]


@pytest.mark.parametrize("name", sources.IMAGE_SETS)
def test_each_benchmark_builds_from_a_folder(tmp_path, name):
  folder = tmp_path / name
  folder.mkdir()
  write(folder / f"{name}_test.jsonl", ROWS)
  src = sources.source(name, str(folder), "test", cache_dir=str(tmp_path / "cache"))
  assert len(src) == 3
  assert list(src) == image_qa.load(str(folder / f"{name}_test.jsonl"))
  assert src[0].caption == "A tall iron tower." and src[1].images == tuple(ROWS[1]["images"])


def test_split_files_in_a_folder(tmp_path):
  write(tmp_path / "test.json", ROWS, jsonl=False)
  assert image_qa.split_file(str(tmp_path), "test").endswith("test.json")
  with pytest.raises(FileNotFoundError, match=r"no train.jsonl, train.json or \*_train"):
    image_qa.split_file(str(tmp_path), "train")
  write(tmp_path / "a_dev.jsonl", ROWS)
  write(tmp_path / "b_dev.jsonl", ROWS)
  with pytest.raises(ValueError, match=r"several files for split 'dev': \['a_dev.jsonl', "):
    image_qa.split_file(str(tmp_path), "dev")


@pytest.mark.parametrize("row, match", [
    ({"question": "q", "ids": "1", "images": ["aGVsbG8="]},
     r"field 'images\[0\]': not a readable image"),
    ({"question": "q", "ids": "1", "images": ["https://x/a.png"]},
     r"field 'images\[0\]': .*is a URL"),
    ({"question": "q", "ids": "1", "images": "abc"}, "field 'images' must be a list"),
    ({"question": "q", "images": []}, "field 'id' must be a non-empty string"),
    ({"question": "q", "ids": ["1"]}, "field 'ids' must be a non-empty string"),
    ({"question": "", "ids": "1"}, "field 'question' must be a non-empty string"),
    ({"question": "q", "ids": "1", "answer": 3}, "field 'answer' must be a string or a list"),
    ({"question": "q", "ids": "1", "image_caption": [5]}, "field 'image_caption' must be"),
    ([1], r"field '\(record\)' must be a JSON object"),
])
def test_damaged_rows_named_by_file_record_and_field(tmp_path, row, match):
  path = write(tmp_path / "bad.jsonl", [ROWS[2], row])
  with pytest.raises(DatasetError, match=f"bad.jsonl: record 1.*{match}"):
    image_qa.load(path)


def test_bad_json_line_named(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(ROWS[2]) + "\n{oops\n")
  with pytest.raises(DatasetError, match=r"bad.jsonl: line 2: invalid JSON"):
    image_qa.load(str(path))
