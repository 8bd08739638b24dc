"""Image questions of the synthetic world: the emblems, the questions that hide their entity,
the MIA rows read back by image_qa, and the image-search cache read by tools.image_search."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from apex_jax.datasets import DatasetError, World, image_qa, keyword_category, read_examples
from apex_jax.datasets import world_checks, world_emblems, world_images
from apex_jax.tools import image_search, images

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.fixture(scope="module")
def world():
  return World.generate(seed=0, num_entities=60, num_questions=150, image_share=0.4)


@pytest.fixture(scope="module")
def text_world():
  return World.generate(seed=0, num_entities=60, num_questions=150)


@pytest.fixture(scope="module")
def written(world, tmp_path_factory):
  folder = tmp_path_factory.mktemp("image_world")
  return str(folder), world.write(str(folder), test_fraction=0.25)


def _small(image: np.ndarray) -> np.ndarray:
  """28 x 28 block means: what differs at the scale of 16 px patches, not single pixels."""
  return image.reshape(28, 16, 28, 16, 3).mean(axis=(1, 3))


def test_every_entity_has_its_own_emblem_and_caption(world):
  assert set(world.emblems) == set(world.entities)
  assert len(set(world.emblems.values())) == len(world.entities)
  captions = [world_emblems.caption(e) for e in world.emblems.values()]
  assert len(set(captions)) == len(captions)
  assert all(world_emblems.shown(world.emblems, world_emblems.caption(e)) == i
             for i, e in world.emblems.items())


def test_emblems_are_told_apart_at_patch_scale(world):
  small = np.stack([_small(world_emblems.render(e)) for e in world.emblems.values()])
  gaps = np.abs(small[:, None] - small[None]).mean(axis=(2, 3, 4))
  np.fill_diagonal(gaps, np.inf)
  assert gaps.min() > 3.0, gaps.min()  # 6.22 measured on this world
  # a search result's near copy is nearer its own emblem than any other entity's
  ids = list(world.emblems)
  for k in range(0, len(ids), 7):
    copy = _small(world_emblems.render(world.emblems[ids[k]], 1, ids[k]))
    assert np.abs(small - copy).mean(axis=(1, 2, 3)).argmin() == k


def test_render_is_deterministic_and_variants_differ(world):
  emblem = next(iter(world.emblems.values()))
  a, b = world_emblems.render(emblem), world_emblems.render(emblem)
  assert a.shape == (448, 448, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
  assert np.array_equal(world_emblems.render(emblem, 2, "x"), world_emblems.render(emblem, 2, "x"))
  assert not np.array_equal(a, world_emblems.render(emblem, 1, "x"))
  assert not np.array_equal(world_emblems.render(emblem, 1, "x"),
                            world_emblems.render(emblem, 1, "y"))


def test_caption_describes_without_naming():
  emblem = world_emblems.Emblem("triangle", "orange", "dots", 1, "pale blue")
  assert world_emblems.caption(emblem) == \
      "an orange triangle emblem with one black dot on a pale blue field"


def test_image_questions_hide_their_entity_and_keep_the_text_world(world, text_world):
  chains = [e for e in text_world.examples if e.kind == "chain"]
  asked = [e for e in world.examples if e.images]
  assert len(asked) == round(0.4 * len(chains))
  assert world.passages == text_world.passages
  for plain, image in zip(text_world.examples, world.examples):
    if not image.images:
      assert image == plain
      continue
    entity = world_emblems.shown(world.emblems, image.caption)
    assert world.name(entity) in plain.question and world.name(entity) not in image.question
    assert f"the {world.entities[entity].kind} in the image" in image.question
    assert (image.answers, image.chain, image.id) == (plain.answers, plain.chain, plain.id)
    assert image.category == keyword_category(image.question)
    assert np.array_equal(images.decode_base64(image.images[0], "q"),
                          world_emblems.render(world.emblems[entity]))
  world.check()


def test_same_seed_same_image_questions(world):
  again = World.generate(seed=0, num_entities=60, num_questions=150, image_share=0.4)
  assert again.examples == world.examples and again.emblems == world.emblems
  other = World.generate(seed=1, num_entities=60, num_questions=150, image_share=0.4)
  assert other.emblems != world.emblems
  none = World.generate(seed=0, num_entities=60, num_questions=150, image_share=0.0)
  assert not none.emblems and not any(e.images for e in none.examples)


def test_hide_replaces_the_name_and_its_article():
  assert world_images.hide("Who directed the film Kobal?", "Kobal", "film") == \
      "Who directed the film in the image?"
  assert world_images.hide("How is the Kobal made?", "Kobal", "product") == \
      "How is the product in the image made?"
  assert world_images.hide("In which city was Kobal Rin born?", "Kobal Rin", "person") == \
      "In which city was the person in the image born?"
  with pytest.raises(DatasetError, match="names 'Kobal' 0 times"):
    world_images.hide("Who directed the film Kobalt?", "Kobal", "film")


def test_checks_catch_a_named_or_uncaptioned_image_question(world):
  k, example = next((k, e) for k, e in enumerate(world.examples) if e.images)
  entity = world_emblems.shown(world.emblems, example.caption)

  def broken(**change):
    examples = list(world.examples)
    examples[k] = dataclasses.replace(example, **change)
    return world_checks.problems(dataclasses.replace(world, examples=examples))

  assert not world_checks.problems(world)
  named = broken(question=example.question.replace("?", f" ({world.name(entity)})?"))
  assert any("names the entity in its image" in p for p in named)
  assert any("is no entity's emblem" in p for p in broken(caption="a plain picture"))
  assert any("2 images, not 1" in p for p in broken(images=example.images * 2))


def test_bad_settings_are_errors(world, tmp_path):
  with pytest.raises(DatasetError, match="image_share must be a number in \\[0, 1\\]; got 1.5"):
    World.generate(seed=0, num_entities=60, num_questions=20, image_share=1.5)
  with pytest.raises(DatasetError, match="image_results must be an integer in \\[1, 3\\]; got 4"):
    world.write(str(tmp_path), image_results=4)
  with pytest.raises(DatasetError, match="more than the 3072 distinct emblems"):
    world_emblems.draw(0, [f"e{i}" for i in range(3073)])


def test_text_files_leave_out_the_image_questions(world, written):
  folder, meta = written
  corpus = os.path.join(folder, "corpus.jsonl")
  text = [e for s in ("train", "test") for e in read_examples(os.path.join(folder, f"{s}.jsonl"),
                                                              corpus)]
  assert not any("in the image" in e.question for e in text)
  assert len(text) + meta["image_train"] + meta["image_test"] == len(world.examples)
  assert (meta["train"], meta["test"]) == (len(text) - meta["test"], meta["test"])
  assert json.load(open(os.path.join(folder, "meta.json"))) == meta


def test_mia_rows_round_trip_through_image_qa(world, written):
  folder, meta = written
  by_id = {e.id: e for e in world.examples}
  qa = os.path.join(folder, meta["image_qa"])
  read = [e for s in ("train", "test") for e in image_qa.load(image_qa.split_file(qa, s))]
  assert len(read) == meta["image_train"] + meta["image_test"] == sum(
      bool(e.images) for e in world.examples)
  for row in read:
    mine = by_id[row.id]
    assert (row.question, row.answers, row.images, row.caption, row.category, row.kind) == (
        mine.question, mine.answers, mine.images, mine.caption, mine.category, "image")
  inputs = image_qa.episode_inputs(read[:2])
  assert inputs["data_ids"] == [read[0].id, read[1].id]
  assert inputs["images"][0].shape == (448, 448, 3)


def test_image_search_recovers_the_hidden_name(world, written):
  folder, meta = written
  search = image_search.ImageSearch(os.path.join(folder, meta["image_search"]))
  for example in (e for e in world.examples if e.images):
    entity = world_emblems.shown(world.emblems, example.caption)
    found = search.search(example.id)
    assert len(found.titles) == len(found.images) == 3
    assert found.titles[0] == f"The emblem of {world.name(entity)}"
    assert world.name(entity) in found.text and world.name(entity) not in example.question
    kinds = {world.entities[i].kind for i in world.entities
             if f"The emblem of {world.name(i)}" in found.titles}
    assert kinds == {world.entities[entity].kind}  # the distractors are of its kind
    question = _small(image_qa.image_of(example))
    gaps = [np.abs(_small(im) - question).mean() for im in found.images]
    assert int(np.argmin(gaps)) == 0  # the match is the nearest picture


def test_fewer_results_and_a_damaged_entry(world, tmp_path):
  example = next(e for e in world.examples if e.images)
  world_images.write_entry(world, str(tmp_path), example, results=1)
  found = image_search.ImageSearch(str(tmp_path)).search(example.id)
  assert len(found.titles) == 1
  os.remove(tmp_path / example.id / "meta.json")
  with pytest.raises(image_search.ImageSearchError, match="meta.json: missing"):
    image_search.ImageSearch(str(tmp_path)).search(example.id)


def test_make_world_writes_the_image_files(tmp_path):
  out = tmp_path / "w"
  run = subprocess.run([sys.executable, "-m", "launchers.make_world", f"--out={out}",
                        "--entities=40", "--questions=40", "--seed=3", "--image_share=0.25",
                        "--image_results=2"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert run.returncode == 0, run.stderr
  assert sorted(os.listdir(out)) == ["corpus.jsonl", "image_qa", "image_search", "meta.json",
                                     "test.jsonl", "train.jsonl"]
  meta = json.load(open(out / "meta.json"))
  assert meta["image_results"] == 2 and meta["image_train"] + meta["image_test"] > 0
  assert len(os.listdir(out / "image_search")) == meta["image_train"] + meta["image_test"]
  bad = subprocess.run([sys.executable, "-m", "launchers.make_world", f"--out={out}",
                        "--image_share=2"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert bad.returncode == 1 and "image_share must be a number in [0, 1]" in bad.stderr


def test_a_procedure_world_takes_image_questions_too():
  world = World.generate(seed=2, num_entities=60, num_questions=100, procedures=True,
                         image_share=0.5)
  assert any(e.images for e in world.examples)
  world.check()
