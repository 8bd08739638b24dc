"""A 20-passage corpus and its index with the real (offline) all-MiniLM-L6-v2, built once."""

import json
import zlib

import numpy as np
import pytest

from apex_jax.tools import index

# (id, title, text); half are written in the `contents` layout, half as title/text.
PASSAGES = [
    ("p00", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars "
     "in Paris, France. It was designed by Gustave Eiffel's company and completed in 1889."),
    ("p01", "Photosynthesis", "Photosynthesis is the process by which green plants use sunlight, "
     "water and carbon dioxide to produce glucose and release oxygen."),
    ("p02", "Python (programming language)", "Python is a high-level programming language "
     "created by Guido van Rossum and first released in 1991."),
    ("p03", "Mount Everest", "Mount Everest is Earth's highest mountain above sea level, located "
     "in the Himalayas on the border between Nepal and China."),
    ("p04", "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600 about the "
     "Prince of Denmark who seeks revenge for his father's murder."),
    ("p05", "Great Barrier Reef", "The Great Barrier Reef off the coast of Queensland, Australia, "
     "is the world's largest coral reef system."),
    ("p06", "Penicillin", "Penicillin was discovered by Alexander Fleming in 1928 when he "
     "noticed that a mould killed the bacteria in a petri dish."),
    ("p07", "Amazon River", "The Amazon River in South America carries more water than any "
     "other river and flows into the Atlantic Ocean."),
    ("p08", "Apollo 11", "Apollo 11 was the first crewed mission to land on the Moon; Neil "
     "Armstrong stepped onto the lunar surface in July 1969."),
    ("p09", "Mona Lisa", "The Mona Lisa is a portrait painted by Leonardo da Vinci and is "
     "displayed at the Louvre museum."),
    ("p10", "Espresso", "Espresso is a concentrated coffee drink brewed by forcing hot water "
     "under pressure through finely ground coffee beans."),
    ("p11", "Black hole", "A black hole is a region of spacetime where gravity is so strong that "
     "nothing, not even light, can escape from it."),
    ("p12", "Great Wall of China", "The Great Wall of China is a series of fortifications built "
     "across northern China to protect against nomadic invasions."),
    ("p13", "Honey bee", "Honey bees live in colonies with a single queen and communicate the "
     "location of flowers to each other with a waggle dance."),
    ("p14", "Bitcoin", "Bitcoin is a decentralised digital currency introduced in 2009 by an "
     "anonymous person using the name Satoshi Nakamoto."),
    ("p15", "Marathon", "The marathon is a long-distance running race of 42.195 kilometres, "
     "named after the legend of a Greek messenger."),
    ("p16", "Vaccination", "Vaccines train the immune system to recognise a pathogen so the "
     "body can fight a later infection."),
    ("p17", "Tokyo", "Tokyo is the capital of Japan and one of the most populous metropolitan "
     "areas in the world."),
    ("p18", "Jazz", "Jazz is a music genre that originated in the African-American communities "
     "of New Orleans in the late 19th and early 20th centuries."),
    ("p19", "Volcano", "A volcano is a rupture in the crust of a planet through which lava, "
     "volcanic ash and gases escape from a magma chamber."),
]


def write_corpus(path, passages=PASSAGES):
  with open(path, "w") as f:
    for i, (pid, title, text) in enumerate(passages):
      row = ({"id": pid, "contents": f'"{title}"\n{text}'} if i % 2 == 0
             else {"id": pid, "title": title, "text": text})
      f.write(json.dumps(row) + "\n")
  return str(path)


class HashEncoder:
  """A fast stand-in for tests that do not look at ranking quality: a fixed random unit vector
  per distinct text."""

  path, dim = "hash-encoder", 16

  def encode(self, texts):
    rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), self.dim)


@pytest.fixture(scope="session")
def encoder():
  return index.SentenceEncoder()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
  return write_corpus(tmp_path_factory.mktemp("corpus") / "passages.jsonl")


@pytest.fixture(scope="session")
def index_dir(corpus_file, encoder, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("index") / "flat")
  index.build_index(corpus_file, out, encoder, batch_size=8, log=lambda _: None)
  return out


@pytest.fixture(scope="session")
def retriever(index_dir, encoder):
  return index.Retriever(index_dir, encoder)
