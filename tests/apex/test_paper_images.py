"""configs/apex/paper.py's image side: the paper's image benchmarks as data sources read from a
folder in the MIA data's layout, the image-search cache, and the qwen25_vl_7b executor preset."""

import json

import pytest

from apex_jax import experiment
from apex_jax.datasets import sources
from apex_jax.tools.image_search import ImageSearch
from configs.apex import paper
from morse_jax.llm import presets
from tests.apex.datasets.test_image_qa import ROWS


@pytest.mark.parametrize("name", sources.IMAGE_SETS)
def test_image_benchmark_sources_load(tmp_path, name):
  folder = tmp_path / name
  folder.mkdir()
  for split in ("train", "test"):
    (folder / f"{name}_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  (tmp_path / "cache").mkdir()
  c = paper.get_config(f"model=/m,data={name}:{folder},image_cache={tmp_path / 'cache'}")
  assert (c.data.source, c.data.test_split) == (name, "test")
  c.data.cache_dir = str(tmp_path / "tfds")
  c.search.kind = "word"  # the in-process search: the loader gathers the (no) passages
  train, test, passages = experiment.load_data(c)
  assert len(train) == len(test) == 3 and passages == []
  assert test[0].caption == "A tall iron tower." and test[0].images
  search = experiment.image_searcher(c)
  assert isinstance(search, ImageSearch) and search.max_results == 3


def test_image_cache_unset_or_missing():
  assert experiment.image_searcher(paper.get_config("model=/m")) is None
  with pytest.raises(ValueError, match="config.image_search.root '/no/cache' is not a folder"):
    experiment.image_searcher(paper.get_config("model=/m,image_cache=/no/cache"))


def test_qwen25_vl_7b_executor_preset():
  c = paper.get_config("model=/m,executor=/m/Qwen2.5-VL-7B-Instruct")
  assert dict(c.executor_model) == dict(preset="qwen25_vl_7b",
                                        path="/m/Qwen2.5-VL-7B-Instruct", dtype="bfloat16")
  vl = presets.vl_preset(c.executor_model.preset)
  assert (vl.text.num_layers, vl.text.hidden_size, vl.text.num_kv_heads) == (28, 3584, 4)
  assert vl.text.mrope_section == (16, 24, 24) and vl.text.vocab_size == 152064
  assert (vl.vision.depth, vl.vision.hidden_size, vl.vision.fullatt_block_indexes) == (
      32, 1280, (7, 15, 23, 31))
  assert vl.image_token_id == 151655 and vl.image_tokens((1, 32, 32)) == 256
  with pytest.raises(ValueError, match="VL preset 'qwen_vl' not in"):
    presets.vl_preset("qwen_vl")
