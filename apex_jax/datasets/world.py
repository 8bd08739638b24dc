"""A synthetic multi-hop world for the CPU demo: invented entities, one passage each, and
questions of 1 to 3 hops over all ten memory categories, deterministic by seed.

Entities (every name an invented word, so no model can know the answers without searching):
  country  capital, cities                    city     country, population, river
  river    length, the cities it flows through person   birth city, birth year, occupation,
  company  founder, year, headquarters, product                 employer
  product  kind, use, method of making         film     director, year, filming city
  event    city, year, winner
Relations are ids; every fact is stated in its entity's passage ("Tarsk is a city in Kovia."),
and no name word is used twice, so an answer string names one entity only.

  world = World.generate(seed=0, num_entities=120, num_questions=400)
  world.check()                              # the gold-chain checks (raises on any problem)
  World.generate(0, 120, 400, procedures=True)   # career / property facts in records (below)
  world.write("data/world", test_fraction=0.2, holdout_categories=("event",))
  World.generate(0, 120, 400, image_share=0.3)   # 30% of the chain questions ask about an image

`write` produces corpus.jsonl (for launchers/build_index.py), train.jsonl and test.jsonl (the
question layout of `apex_jax.datasets.corpus`) and meta.json. The question templates are in
`world_questions`, the checks in `world_checks`; with procedures, the career and property facts
sit in record passages whose right one is fixed per world and category (`world_records`).
With an image share, every entity has an emblem (`world_emblems`) and `write` puts the image
questions in the MIA layout beside their image-search cache (`world_images`), not in the text files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any, Mapping, Sequence

from apex_jax.datasets import world_checks, world_emblems, world_images, world_questions, \
    world_records
from apex_jax.datasets.corpus import write_examples, write_passages
from apex_jax.datasets.records import DatasetError, Hop, QAExample
from apex_jax.datasets.world_questions import split
from apex_jax.datasets.world_records import listing_id, RECORDS
from apex_jax.datasets.world_words import EVENT_TYPES, KINDS, METHODS, OCCUPATIONS, USES, Names
from apex_jax.tools.passages import Passage

# Relative sizes of the entity kinds, and the least of each a world needs.
SHARES = {"country": 1.0, "city": 3.0, "river": 1.0, "person": 5.0, "company": 2.0,
          "product": 2.0, "film": 2.0, "event": 1.5}
MINIMUM = {"country": 2, "city": 4, "river": 2, "person": 8, "company": 2, "product": 2,
           "film": 2, "event": 2}
MIN_ENTITIES = sum(MINIMUM.values())


@dataclasses.dataclass(frozen=True)
class Entity:
  id: str  # "<kind>-<n>"; also the id of its passage
  kind: str
  name: str
  facts: Mapping[str, Any]  # attribute -> a literal, or another entity's id (relations)


def _article(word: str) -> str:
  return ("an " if word[0] in "aeiou" else "a ") + word


def _listing(names: Sequence[str]) -> str:
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def entity_counts(num_entities: int) -> dict[str, int]:
  """Entities per kind: `num_entities` split by SHARES (products = companies, each company makes
  one), at least MINIMUM each, and few enough events that each has its own city and winner."""
  if isinstance(num_entities, bool) or not isinstance(num_entities, int) or \
      num_entities < MIN_ENTITIES:
    raise DatasetError(f"num_entities must be an integer >= {MIN_ENTITIES}; got {num_entities!r}")
  total = sum(SHARES.values())
  counts = {k: max(MINIMUM[k], int(num_entities * s / total)) for k, s in SHARES.items()}
  counts["product"] = counts["company"]
  counts["person"] += num_entities - sum(counts.values())  # the rounding remainder
  counts["event"] = min(counts["event"], counts["city"], counts["person"])
  counts["person"] = max(counts["person"], counts["company"])
  return counts


def _build(rng: random.Random, counts: Mapping[str, int]) -> dict[str, Entity]:
  names = Names(rng)
  ids = {k: [f"{k}-{i}" for i in range(n)] for k, n in counts.items()}
  facts: dict[str, dict[str, Any]] = {i: {} for kind in ids.values() for i in kind}
  name = {i: names.word() for k in ("country", "city", "river", "company", "product", "film")
          for i in ids[k]}
  name.update({i: f"{names.word()} {names.word()}" for i in ids["person"]})
  for i in ids["event"]:
    name[i] = f"{names.word()} {rng.choice(EVENT_TYPES)}"
  # The first cities cover every country and river once, so none is left empty.
  for n, c in enumerate(ids["city"]):
    country = ids["country"][n % counts["country"]]
    river = ids["river"][n] if n < counts["river"] else rng.choice(ids["river"])
    facts[c].update(country=country, population=rng.randrange(2, 900) * 1000, river=river)
    facts[country].setdefault("cities", []).append(c)
    facts[river].setdefault("cities", []).append(c)
  for k in ids["country"]:
    facts[k]["capital"] = facts[k]["cities"][0]
  for r in ids["river"]:
    facts[r]["length"] = rng.randrange(80, 990)
  for p in ids["person"]:
    facts[p].update(born_in=rng.choice(ids["city"]), birth_year=rng.randrange(1850, 1960),
                    occupation=rng.choice(OCCUPATIONS))
  founders = rng.sample(ids["person"], counts["company"])
  for co, pr, founder in zip(ids["company"], ids["product"], founders):
    facts[co].update(founder=founder, year=facts[founder]["birth_year"] + rng.randrange(20, 45),
                     hq=rng.choice(ids["city"]), product=pr)
    facts[founder]["employer"] = co
    facts[pr].update(kind=rng.choice(KINDS), use=rng.choice(USES), method=rng.choice(METHODS))
  for p in ids["person"]:
    facts[p].setdefault("employer", rng.choice(ids["company"]))
  for f in ids["film"]:
    director = rng.choice(ids["person"])
    facts[f].update(director=director, city=rng.choice(ids["city"]),
                    year=facts[director]["birth_year"] + rng.randrange(25, 60))
  for e, c, winner in zip(ids["event"], rng.sample(ids["city"], counts["event"]),
                          rng.sample(ids["person"], counts["event"])):
    facts[e].update(city=c, winner=winner,
                    year=facts[winner]["birth_year"] + rng.randrange(18, 40))
  return {i: Entity(i, i.split("-")[0], name[i], facts[i]) for i in facts}


def sentences(entity: Entity, name: Mapping[str, str]) -> tuple[str, ...]:
  """The passage of an entity, one fact per sentence (`name`: entity id -> name)."""
  n, f = entity.name, entity.facts
  if entity.kind == "country":
    cities = [name[c] for c in f["cities"]]
    return (f"{n} is a country.", f"Its capital is {name[f['capital']]}.",
            f"{n} has {len(cities)} {'city' if len(cities) == 1 else 'cities'}: "
            f"{_listing(cities)}.")
  if entity.kind == "city":
    return (f"{n} is a city in {name[f['country']]}.",
            f"About {f['population']} people live in {n}.",
            f"The river {name[f['river']]} flows through {n}.")
  if entity.kind == "river":
    return (f"The {n} is a river.", f"It is {f['length']} km long.",
            f"It flows through {_listing([name[c] for c in f['cities']])}.")
  if entity.kind == "person":
    return (f"{n} was born in {name[f['born_in']]} in {f['birth_year']}.",
            f"{n} works as {_article(f['occupation'])} at {name[f['employer']]}.")
  if entity.kind == "company":
    return (f"{n} is a company founded by {name[f['founder']]} in {f['year']}.",
            f"Its headquarters are in {name[f['hq']]}.", f"{n} makes the {name[f['product']]}.")
  if entity.kind == "product":
    return (f"The {n} is {_article(f['kind'])} used to {f['use']}.",
            f"It is made by {f['method']}.")
  if entity.kind == "film":
    return (f"{n} is a film directed by {name[f['director']]}.", f"It was released in {f['year']}.",
            f"It was filmed in {name[f['city']]}.")
  if entity.kind == "event":
    return (f"The {n} was an event held in {name[f['city']]} in {f['year']}.",
            f"It was won by {name[f['winner']]}.")
  raise DatasetError(f"entity {entity.id!r}: unknown kind {entity.kind!r}")


@dataclasses.dataclass
class World:
  seed: int
  entities: dict[str, Entity]
  sentences: dict[str, tuple[str, ...]]  # entity id -> its passage's sentences
  passages: list[Passage]
  examples: list[QAExample]
  # With procedures (world_records): category -> its record words (the listings show them),
  # category -> the word whose record holds the fact (the oracle: only the gold chains and the
  # toy corpus read it), entity id -> its records in listing order. Empty without.
  record_words: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  procedure_words: dict[str, str] = dataclasses.field(default_factory=dict)
  records: dict[str, tuple] = dataclasses.field(default_factory=dict)
  # With an image share: entity id -> its emblem (world_emblems). Empty without.
  emblems: dict[str, world_emblems.Emblem] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self._passage_of = {p.id: p for p in self.passages}
    self._entity_of = {p.id: p.id for p in self.passages if p.id in self.entities}
    for i, records in self.records.items():
      self._entity_of.update({listing_id(i): i, **{r.passage_id: i for r in records}})
    self._of_kind: dict[str, list[str]] = {}
    for i, e in self.entities.items():
      self._of_kind.setdefault(e.kind, []).append(i)

  @classmethod
  def generate(cls, seed: int, num_entities: int, num_questions: int,
               procedures: bool = False, image_share: float = 0.0) -> "World":
    """Entities, passages and `num_questions` distinct questions, all a function of `seed`.
    procedures: the career and property facts sit in record passages, the right record fixed per
    category (world_records); the entities, names and questions are those of the world without,
    the record passages follow the entities' passages.
    image_share: that share of the chain questions ask about the entity in an image instead of
    naming it (world_images); the rest of the world is that of the world without."""
    if not isinstance(procedures, bool):
      raise DatasetError(f"procedures must be True or False; got {procedures!r}")
    world_images.check_share(image_share)
    rng = random.Random(seed)
    entities = _build(rng, entity_counts(num_entities))
    name = {i: e.name for i, e in entities.items()}
    text = {i: sentences(e, name) for i, e in entities.items()}
    titles = dict(name)
    book = None
    if procedures:
      book = world_records.draw(seed, entities, text)
      text = {**text, **book.sentences}
      titles.update(book.titles)
    passages = [Passage(i, f'"{titles[i]}"\n{" ".join(s)}') for i, s in text.items()]
    world = cls(seed, entities, text, passages, [])
    if book is not None:
      world = cls(seed, entities, text, passages, [], book.record_words, book.procedure_words,
                  book.records)
    world.examples = world_questions.generate(world, rng, num_questions)
    if image_share:
      world.emblems = world_emblems.draw(seed, entities)
      world.examples = world_images.ask(world, image_share)
    return world

  # ---- lookups used by the question templates and the checks ------------------------------

  def of_kind(self, kind: str) -> list[str]:
    return self._of_kind.get(kind, [])

  def name(self, entity_id: str) -> str:
    return self.entities[entity_id].name

  def passage(self, passage_id: str) -> Passage:
    return self._passage_of[passage_id]

  def has_passage(self, passage_id: str) -> bool:
    return passage_id in self._passage_of

  def entity_of(self, passage_id: str) -> str:
    """The entity a passage is about (its own, or the one whose records it lists or holds)."""
    return self._entity_of[passage_id]

  def hop(self, entity_id: str, query: str, answer: str) -> Hop:
    return Hop(query, entity_id, self.entities[entity_id].name, answer)

  def check(self) -> None:
    """Raises DatasetError listing every problem `world_checks.problems` finds."""
    found = world_checks.problems(self)
    if found:
      raise DatasetError(f"world (seed {self.seed}) fails {len(found)} checks: " +
                         "; ".join(found[:10]))

  def write(self, folder: str, test_fraction: float = 0.2,
            holdout_categories: Sequence[str] = (),
            image_results: int = world_images.RESULTS) -> dict:
    """corpus.jsonl, train.jsonl, test.jsonl and meta.json into `folder`, and the image questions
    (if any) with their search cache of `image_results` results each (world_images); returns
    meta. The split is drawn over all questions, then the image ones leave the text files."""
    train, test = split(self.examples, test_fraction, self.seed, holdout_categories)
    image_train, image_test = ([e for e in s if e.images] for s in (train, test))
    train, test = ([e for e in s if not e.images] for s in (train, test))
    os.makedirs(folder, exist_ok=True)
    write_passages(self.passages, os.path.join(folder, "corpus.jsonl"))
    write_examples(train, os.path.join(folder, "train.jsonl"))
    write_examples(test, os.path.join(folder, "test.jsonl"))
    meta = {"format": 1, "seed": self.seed, "entities": len(self.entities),
            "passages": len(self.passages), "questions": len(self.examples),
            "train": len(train), "test": len(test), "test_fraction": test_fraction,
            "holdout_categories": list(holdout_categories)}
    if self.records:  # the words are in the passages; which one is right is not written
      meta.update(procedures=True, procedure_categories=sorted(self.record_words),
                  records_per_fact=RECORDS)
    if image_train or image_test:
      meta.update(world_images.write(self, folder, image_train, image_test, image_results))
    with open(os.path.join(folder, "meta.json"), "w") as f:
      json.dump(meta, f, indent=2)
    return meta
