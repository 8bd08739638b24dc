"""apex_jax.datasets.sources: fixture files -> tfds builder (array_record) -> tfds.data_source ->
the JSON loaders' records, by index; malformed records named as the loaders name them; the cache
reused while the files are unchanged and rebuilt when one changes."""

import json
import os
import shutil

import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("array_record")

from apex_jax.datasets import DatasetError, World, hotpotqa, read_examples, sources, twowiki
from tests.apex.datasets.test_loaders import HOTPOT_DEV, HOTPOT_TEST, TWOWIKI_DEV, TWOWIKI_TEST


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("world"))
  World.generate(5, 30, 20).write(folder, test_fraction=0.25)
  return folder


@pytest.mark.parametrize("name,path,loader", [
    ("hotpotqa", HOTPOT_DEV, hotpotqa.load), ("hotpotqa", HOTPOT_TEST, hotpotqa.load),
    ("twowiki", TWOWIKI_DEV, twowiki.load), ("twowiki", TWOWIKI_TEST, twowiki.load)])
def test_records_equal_the_json_loader(tmp_path, name, path, loader):
  src = sources.source(name, path, "dev", cache_dir=str(tmp_path))
  expected = loader(path)
  assert len(src) == len(expected) > 0
  assert [src[i] for i in range(len(src))] == expected  # index i = the loader's i-th record
  assert list(src) == expected


def test_world_random_access_and_bounds(tmp_path, world_dir):
  for split in ("train", "test"):
    expected = read_examples(f"{world_dir}/{split}.jsonl", f"{world_dir}/corpus.jsonl")
    src = sources.source("world", world_dir, split, cache_dir=str(tmp_path))
    assert len(src) == len(expected)
    n = len(src)
    for i in (n // 2, 0, n - 1, 1, -1):  # any order, negative from the end
      assert src[i] == expected[i]
    assert src[0].chain and src[0].passages  # gold chain and passages kept
    assert src[1:3] == expected[1:3] and src[:100] == expected
  with pytest.raises(IndexError, match=f"index {n} out of range \\({n} records\\)"):
    src[n]
  with pytest.raises(TypeError):
    src["0"]


def test_official_file_names_in_a_folder(tmp_path):
  folder = tmp_path / "hotpot"
  folder.mkdir()
  shutil.copy(HOTPOT_DEV, folder / "hotpot_dev_distractor_v1.json")
  src = sources.source("hotpotqa", str(folder), "dev_distractor", cache_dir=str(tmp_path / "c"))
  assert list(src) == hotpotqa.load(HOTPOT_DEV)
  with pytest.raises(ValueError, match="no official file for split 'dev'"):
    sources.source("hotpotqa", str(folder), "dev", cache_dir=str(tmp_path / "c"))
  with pytest.raises(FileNotFoundError, match="hotpot_train_v1.1.json: no such file"):
    sources.source("hotpotqa", str(folder), "train", cache_dir=str(tmp_path / "c"))
  with pytest.raises(ValueError, match="not in"):
    sources.source("squad", str(folder), "train")


def test_built_once_then_reused_and_rebuilt_on_change(tmp_path, monkeypatch):
  path = str(tmp_path / "dev.json")
  shutil.copy(TWOWIKI_DEV, path)
  cache = str(tmp_path / "cache")
  assert not sources.is_built("twowiki", path, "dev", cache_dir=cache)
  first = sources.source("twowiki", path, "dev", cache_dir=cache)
  assert sources.is_built("twowiki", path, "dev", cache_dir=cache)
  files = sorted(os.listdir(first.data_dir))
  calls = []
  monkeypatch.setattr(sources, "load_examples", lambda *a: calls.append(a) or [])
  again = sources.source("twowiki", path, "dev", cache_dir=cache)
  assert calls == [] and list(again) == list(first)  # no parsing: read from the cache
  assert sorted(os.listdir(again.data_dir)) == files
  monkeypatch.undo()
  rows = json.load(open(path))[:2]
  with open(path, "w") as f:
    json.dump(rows, f)
  assert not sources.is_built("twowiki", path, "dev", cache_dir=cache)
  assert len(sources.source("twowiki", path, "dev", cache_dir=cache)) == 2


def test_malformed_records_named_by_file_record_and_field(tmp_path, world_dir):
  rows = json.load(open(HOTPOT_DEV))
  rows[2]["answer"] = 7
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps(rows))
  cache = str(tmp_path / "cache")
  with pytest.raises(DatasetError, match=f"^{bad}: record 2 .*field 'answer' must be a string"):
    sources.source("hotpotqa", str(bad), "dev", cache_dir=cache)
  assert os.listdir(os.path.join(cache, "hotpotqa")) == []  # a failed build leaves nothing
  assert not sources.is_built("hotpotqa", str(bad), "dev", cache_dir=cache)  # nothing cached
  folder = tmp_path / "world"
  shutil.copytree(world_dir, folder)
  lines = (folder / "test.jsonl").read_text().splitlines()
  row = json.loads(lines[1])
  del row["hops"]
  lines[1] = json.dumps(row)
  (folder / "test.jsonl").write_text("\n".join(lines) + "\n")
  with pytest.raises(DatasetError, match=f"^{folder}/test.jsonl:2: field 'hops' is missing"):
    sources.source("world", str(folder), "test", cache_dir=cache)


def test_default_cache_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("MORSE_JAX_TFDS_DIR", str(tmp_path))
  assert sources.default_cache_dir() == str(tmp_path)
  monkeypatch.delenv("MORSE_JAX_TFDS_DIR")
  assert sources.default_cache_dir() == os.path.expanduser("~/.cache/morse_jax/tfds")
