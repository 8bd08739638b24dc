"""Category procedures of the synthetic world (`World.generate(..., procedures=True)`): facts that
only experience tells how to read, so that memories and skills have something to carry.

For the career and property categories, the final fact (occupation; population, river length,
number of cities) leaves the entity's passage. The entity gets a listing passage and RECORDS
record passages instead, each record titled by an invented lowercase record word, one holding the
fact and the others decoys of the same type; the listing names the words in an order shuffled
per entity:
  "Kalkar Rula records"       Records of Kalkar Rula: dorn, vesk, pell.
  "Kalkar Rula vesk record"   Kalkar Rula vesk record: painter.
  "Kalkar Rula dorn record"   Kalkar Rula dorn record: farmer.
Which word holds the fact is fixed per world and category (the *procedure*), so a correct run's
workflow, search("Kalkar Rula vesk record"), tells later runs of that category which record to
read; the question never names the word. A gold chain reaching such a fact reads the listing
("<entity> records") and then the right record ("<entity> <word> record").

The search terms decide the layout (apex_jax.tools.overlap scores the distinct query terms a
passage holds). The record query ends in "record", a word of the record passages only ("records"
is the listings'): the listing holds every other term of "<entity> <word>", so without it the two
would tie. The listing has a passage of its own: in the entity's passage, "<entity> records" would
tie with every passage that names the entity and lists its own records (a river's name is in its
cities' passages).

Only career and property: their facts are read by their own categories' questions alone (every
chain of the two ends in one). Time facts are read by the "others" questions too (before, first)
and twice by the age question, so one record word would serve two categories' memories.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Mapping

from apex_jax.datasets.world_words import ENGLISH_LIKE, OCCUPATIONS, Names

RECORDS = 3  # record passages per procedure fact: one right, the others decoys
# entity kind -> (relation of world_questions.FORWARD, memory category) whose fact is recorded
PROCEDURES = {"person": ("occupation", "career"), "city": ("population", "property"),
              "river": ("length", "property"), "country": ("n_cities", "property")}
CATEGORIES = ("career", "property")
_WORD = re.compile(r"\w+")


@dataclasses.dataclass(frozen=True)
class Record:
  word: str
  passage_id: str
  value: str


def listing(records) -> str:
  """The words as the entity's passage lists them (also that hop's answer)."""
  return ", ".join(r.word for r in records)


def record_title(name: str, word: str) -> str:
  return f"{name} {word} record"


def record_query(name: str, word: str) -> str:
  return record_title(name, word)


def listing_title(name: str) -> str:
  return f"{name} records"


def listing_query(name: str) -> str:
  return listing_title(name)


def listing_id(entity_id: str) -> str:
  return f"{entity_id}-records"


def fact_value(entity, relation: str) -> str:
  value = entity.facts["cities" if relation == "n_cities" else relation]
  return str(len(value) if relation == "n_cities" else value)


def _decoys(rng: random.Random, relation: str, value: str, n: int) -> list[str]:
  """n distinct values of the fact's type, none equal to the true one."""
  if relation == "occupation":
    return rng.sample([o for o in OCCUPATIONS if o != value], n)
  draw = {"population": lambda: rng.randrange(2, 900) * 1000,
          "length": lambda: rng.randrange(80, 990),
          "n_cities": lambda: rng.randrange(1, 10)}[relation]
  out: list[str] = []
  while len(out) < n:
    x = str(draw())
    if x != value and x not in out:
      out.append(x)
  return out


def invented_words(rng: random.Random, taken: set[str], n: int) -> list[str]:
  """n invented lowercase words of the name generator's shape, none of them in `taken`."""
  names = Names(rng)
  names.used |= taken | ENGLISH_LIKE
  return [names.word().lower() for _ in range(n)]


def main_sentences(entity, name: Mapping[str, str]) -> tuple[str, ...]:
  """The entity's passage without its recorded fact. A country no longer lists its cities (their
  count is the recorded fact)."""
  n, f = entity.name, entity.facts
  if entity.kind == "person":
    head = (f"{n} was born in {name[f['born_in']]} in {f['birth_year']}.",
            f"{n} is employed at {name[f['employer']]}.")
  elif entity.kind == "city":
    head = (f"{n} is a city in {name[f['country']]}.",
            f"The river {name[f['river']]} flows through {n}.")
  elif entity.kind == "country":
    head = (f"{n} is a country.", f"Its capital is {name[f['capital']]}.")
  else:
    cities = [name[c] for c in f["cities"]]
    through = cities[0] if len(cities) == 1 else ", ".join(cities[:-1]) + " and " + cities[-1]
    head = (f"The {n} is a river.", f"It flows through {through}.")
  return head


@dataclasses.dataclass(frozen=True)
class Book:
  """A world's records: what World.generate adds with procedures on."""
  record_words: dict[str, tuple[str, ...]]  # category -> its RECORDS words (the listings show them)
  procedure_words: dict[str, str]  # category -> the word whose record holds the fact (the oracle)
  records: dict[str, tuple[Record, ...]]  # entity id -> its records, in its listing's order
  sentences: dict[str, tuple[str, ...]]  # passage id -> sentences: the changed entity passages,
  # then per entity its listing and its records
  titles: dict[str, str]  # listing and record passage id -> title


def draw(seed: int, entities: Mapping[str, Any], sentences: Mapping[str, tuple[str, ...]]) -> Book:
  """The records of a world, from their own random stream (the entities, names and questions
  stay those of the world without procedures). The words avoid every word of the world."""
  rng = random.Random(f"procedures-{seed}")
  taken = {w.lower() for e in entities.values() for w in e.name.split()}
  taken |= {w.lower() for s in sentences.values() for t in s for w in _WORD.findall(t)}
  taken |= {"record", "records"}
  drawn = invented_words(rng, taken, RECORDS * len(CATEGORIES))
  record_words = {c: tuple(drawn[k * RECORDS:(k + 1) * RECORDS]) for k, c in enumerate(CATEGORIES)}
  procedure_words = {c: rng.choice(words) for c, words in record_words.items()}
  name = {i: e.name for i, e in entities.items()}
  records, text, titles = {}, {}, {}
  for i, e in entities.items():
    if e.kind not in PROCEDURES:
      continue
    relation, category = PROCEDURES[e.kind]
    value = fact_value(e, relation)
    words = list(record_words[category])
    rng.shuffle(words)
    decoys = iter(_decoys(rng, relation, value, RECORDS - 1))
    mine = tuple(Record(w, f"{i}-{w}", value if w == procedure_words[category] else next(decoys))
                 for w in words)
    records[i] = mine
    text[i] = main_sentences(e, name)
    titles[listing_id(i)] = listing_title(e.name)
    text[listing_id(i)] = (f"Records of {e.name}: {listing(mine)}.",)
    for r in mine:
      titles[r.passage_id] = record_title(e.name, r.word)
      text[r.passage_id] = (f"{titles[r.passage_id]}: {r.value}.",)
  return Book(record_words, procedure_words, records, text, titles)
