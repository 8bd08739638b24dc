"""APEx question sets: HotpotQA and 2WikiMultiHopQA from their official JSON files, and a
synthetic multi-hop world for the CPU demo, all as `QAExample`s.

  examples = hotpotqa.load("hotpot_dev_distractor_v1.json")      # or twowiki.load(...)
  to_corpus(examples, "corpus.jsonl")                # -> python -m launchers.build_index
  scores = evaluate({"5a8b57f25542995d1e6f1371": "yes"}, examples)
  train = source("hotpotqa", "/data/hotpotqa", "train")   # array_record: len, train[i]

  world = World.generate(seed=0, num_entities=120, num_questions=400)
  world.check(); world.write("data/world")          # corpus.jsonl, train.jsonl, test.jsonl
  train = read_examples("data/world/train.jsonl", "data/world/corpus.jsonl")

Modules: records (QAExample, Hop, SupportingFact, DatasetError), categories (question ->
memory category), hotpotqa, twowiki, corpus (corpus export, question-set JSONL), metrics
(evaluate), world / world_questions / world_checks / world_records / world_emblems /
world_images (the synthetic world, its category procedures, its emblem questions), sources
(tensorflow-datasets builders: random access by index, cached).
"""

from apex_jax.datasets import hotpotqa, twowiki
from apex_jax.datasets.categories import RULES, classifier, keyword_category
from apex_jax.datasets.corpus import read_examples, to_corpus, write_examples, write_passages
from apex_jax.datasets.metrics import evaluate
from apex_jax.datasets.records import DatasetError, Hop, QAExample, SupportingFact
from apex_jax.datasets.sources import Source, source
from apex_jax.datasets.world import World

__all__ = ["DatasetError", "Hop", "QAExample", "RULES", "Source", "SupportingFact", "World",
           "classifier", "evaluate", "hotpotqa", "keyword_category", "read_examples", "source",
           "to_corpus", "twowiki", "write_examples", "write_passages"]
