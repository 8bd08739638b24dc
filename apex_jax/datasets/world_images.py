"""Image questions of the synthetic world: a share of its chain questions ask about "the <kind>
in the image" instead of naming the anchor entity, carry the anchor's emblem (world_emblems) and
its caption, and keep their gold chain (the first hop's query names the entity the image search
recovers). Their files:

  <folder>/image_qa/train.jsonl, test.jsonl     the MIA data's rows (datasets.image_qa reads them):
      {"question", "answer": [aliases], "ids": the question id, "images": [a PNG data URL],
       "image_caption": [caption]}
  <folder>/image_search/<id>/meta.json          the authors' cache (tools.image_search reads it):
      {"search_results": [{"title": "The emblem of <name>", "image_url": ...}, ...]}
  <folder>/image_search/<id>/img_000.png ...    the anchor's emblem slightly changed, then the
                                                emblems of the most alike entities of its kind

The match is the first result, as a reverse image search ranks the same picture first; the others
are distractors, so titles alone do not say which entity the picture is. The questions chosen are
drawn from `random.Random(f"images:{seed}")`, so the text world is the same with or without them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from typing import Sequence

from apex_jax.datasets import world_emblems
from apex_jax.datasets.records import DatasetError, QAExample
from apex_jax.datasets.world_checks import contains
from apex_jax.tools import images as images_lib
from apex_jax.tools.image_search import check_id

QA_FOLDER, SEARCH_FOLDER = "image_qa", "image_search"
RESULTS = 3  # the authors' tool returns at most 3
ELIGIBLE = ("chain",)  # kinds with one anchor named in the question


def check_share(image_share) -> float:
  if isinstance(image_share, bool) or not isinstance(image_share, (int, float)) or \
      not 0 <= image_share <= 1:
    raise DatasetError(f"image_share must be a number in [0, 1]; got {image_share!r}")
  return float(image_share)


def named(world, question: str) -> str:
  """The one entity a chain question names (its anchor)."""
  found = [i for i, e in world.entities.items() if contains(question, e.name)]
  if len(found) != 1:
    raise DatasetError(f"question {question!r} names {len(found)} entities, not one")
  return found[0]


def anchor(world, example: QAExample) -> str:
  """The entity an image question's image shows (its caption's emblem)."""
  found = world_emblems.shown(world.emblems, example.caption)
  if found is None:
    raise DatasetError(f"{example.id}: caption {example.caption!r} is no entity's emblem")
  return found


def hide(question: str, name: str, kind: str) -> str:
  """`question` with the entity's name (and the "the" / "the film" before it) replaced by
  "the <kind> in the image"."""
  pattern = rf"(?<!\w)(?:the {re.escape(kind)} |the )?{re.escape(name)}(?!\w)"
  hidden, n = re.subn(pattern, f"the {kind} in the image", question)
  if n != 1:  # `named` found it once; a second match would need two spellings of it
    raise DatasetError(f"question {question!r} names {name!r} {n} times, not once")
  return hidden


def ask(world, image_share: float) -> list[QAExample]:
  """The world's examples, `image_share` of its chain questions (rounded) turned into image
  questions; the others unchanged."""
  eligible = [k for k, e in enumerate(world.examples) if e.kind in ELIGIBLE]
  rng = random.Random(f"images:{world.seed}")
  chosen = set(rng.sample(eligible, round(check_share(image_share) * len(eligible))))
  return [_image_question(world, e) if k in chosen else e for k, e in enumerate(world.examples)]


def _image_question(world, example: QAExample) -> QAExample:
  entity = world.entities[named(world, example.question)]
  emblem = world.emblems[entity.id]
  return dataclasses.replace(
      example, question=hide(example.question, entity.name, entity.kind),
      images=(images_lib.to_data_url(world_emblems.render(emblem)),),
      caption=world_emblems.caption(emblem))


def mia_row(example: QAExample) -> dict:
  return {"question": example.question, "answer": list(example.answers), "ids": example.id,
          "images": list(example.images), "image_caption": [example.caption]}


def write_rows(examples: Sequence[QAExample], path: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(mia_row(e)) + "\n" for e in examples)


def distractors(world, entity_id: str, n: int) -> list[str]:
  """The `n` entities of the same kind whose emblems share the most attributes with
  `entity_id`'s (ties in world order): the near misses of a reverse image search."""
  mine = dataclasses.astuple(world.emblems[entity_id])
  others = [i for i in world.of_kind(world.entities[entity_id].kind) if i != entity_id]
  shared = {i: sum(a == b for a, b in zip(mine, dataclasses.astuple(world.emblems[i])))
            for i in others}
  return sorted(others, key=lambda i: -shared[i])[:n]


def check_results(results) -> int:
  if isinstance(results, bool) or not isinstance(results, int) or not 1 <= results <= RESULTS:
    raise DatasetError(f"image_results must be an integer in [1, {RESULTS}]; got {results!r}")
  return results


def write_entry(world, root: str, example: QAExample, results: int = RESULTS) -> None:
  """One question's cache folder: meta.json and img_000.png ... (the match first)."""
  check_results(results)
  match = anchor(world, example)
  shown = [match] + distractors(world, match, results - 1)
  folder = os.path.join(root, check_id(example.id))
  os.makedirs(folder, exist_ok=True)
  found = []
  for k, entity_id in enumerate(shown):
    image = world_emblems.render(world.emblems[entity_id], 1 + k, f"{example.id}:{entity_id}")
    with open(os.path.join(folder, f"img_{k:03d}.png"), "wb") as f:
      f.write(images_lib.encode_png(image))
    found.append({"title": f"The emblem of {world.name(entity_id)}",
                  "image_url": f"world{world.seed}://emblems/{entity_id}.png"})
  with open(os.path.join(folder, "meta.json"), "w", encoding="utf-8") as f:
    json.dump({"search_results": found}, f, indent=1)


def write(world, folder: str, train: Sequence[QAExample], test: Sequence[QAExample],
          results: int = RESULTS) -> dict:
  """The image questions' rows and their search cache under `folder`; returns meta's part."""
  check_results(results)
  qa, cache = os.path.join(folder, QA_FOLDER), os.path.join(folder, SEARCH_FOLDER)
  os.makedirs(qa, exist_ok=True)
  write_rows(train, os.path.join(qa, "train.jsonl"))
  write_rows(test, os.path.join(qa, "test.jsonl"))
  for example in list(train) + list(test):
    write_entry(world, cache, example, results)
  return {"image_train": len(train), "image_test": len(test), "image_results": results,
          "image_qa": QA_FOLDER, "image_search": SEARCH_FOLDER}
