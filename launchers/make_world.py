"""Write a synthetic multi-hop world (passages and questions) for the APEx CPU demo.

  python -m launchers.make_world --out=data/world --seed=0 --entities=120 --questions=400
  python -m launchers.make_world --out=data/world --holdout_categories=event,process
  python -m launchers.make_world --out=data/world_records --procedures
  python -m launchers.make_world --out=data/world_images --image_share=0.3 --image_results=3
  python -m launchers.build_index --corpus=data/world/corpus.jsonl --out=data/world_index

Writes corpus.jsonl (Search-R1 layout, one passage per entity), train.jsonl and test.jsonl (the
question layout of apex_jax.datasets.corpus, with gold hop chains) and meta.json. The world is
checked (gold hops, reachability, unique names) before anything is written; exit code 1 if not.
With --image_share, that share of the chain questions ask about an entity's emblem instead of
naming it: image_qa/train.jsonl and test.jsonl (the MIA rows, datasets.image_qa) and their
image-search cache image_search/<id>/ (tools.image_search) are written beside the text files.
"""

from __future__ import annotations

import collections
import json
import sys

from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Folder to write.", required=True)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the entities, the questions and the split.")
_ENTITIES = flags.DEFINE_integer("entities", 120, "Entities (one passage each).")
_QUESTIONS = flags.DEFINE_integer("questions", 400, "Distinct questions.")
_TEST_FRACTION = flags.DEFINE_float("test_fraction", 0.2, "Share of the questions held out.")
_PROCEDURES = flags.DEFINE_bool("procedures", False, "Career and property facts in record "
                                 "passages, the right record fixed per category "
                                 "(apex_jax.datasets.world_records).")
_IMAGE_SHARE = flags.DEFINE_float("image_share", 0.0, "Share of the chain questions asked about "
                                  "the entity in an image (apex_jax.datasets.world_images).")
_IMAGE_RESULTS = flags.DEFINE_integer("image_results", 3, "Image-search results per image "
                                      "question: the match, then distractors (1 to 3).")
_HOLDOUT = flags.DEFINE_list("holdout_categories", [], "Categories whose questions all go to "
                             "test.jsonl.")


def banner(text: str) -> None:
  # morse_jax.experiments.pipeline.banner's format, without importing jax for a data-only launcher.
  print(f"\n==== {text} " + "=" * max(0, 60 - len(text)), flush=True)


def main(argv):
  del argv
  from apex_jax.datasets import DatasetError, World

  banner("generate")
  try:
    world = World.generate(_SEED.value, _ENTITIES.value, _QUESTIONS.value, _PROCEDURES.value,
                           _IMAGE_SHARE.value)
    world.check()
  except DatasetError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"{len(world.passages)} passages, {len(world.examples)} questions")
  print("categories:", dict(collections.Counter(e.category for e in world.examples)))
  print("hops:", dict(sorted(collections.Counter(e.hops for e in world.examples).items())))
  if world.emblems:
    print(f"image questions: {sum(bool(e.images) for e in world.examples)}")
  banner("write")
  try:
    meta = world.write(_OUT.value, _TEST_FRACTION.value, tuple(_HOLDOUT.value),
                       _IMAGE_RESULTS.value)
  except DatasetError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(meta, indent=2))


if __name__ == "__main__":
  app.run(main)
