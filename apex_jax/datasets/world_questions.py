"""Question templates of the synthetic world, their gold hop chains, and the train/test split.

A chain template walks relations from an anchor entity named in the question; each step is one
hop: a search query naming the entity known so far, the passage that states the fact, and the
fact (the next entity's name, or a literal). The answer is the last hop's answer. The other
kinds combine two looked-up facts:
  age     How old was P when the film F was released?   release year - birth year
  before  Was A born before B?                           yes iff year(A) < year(B)
  first   Which film was released first, F1 or F2?        the film with the smaller year
  same    Were A and B born in the same city?             yes iff the two cities are equal
Every question's category is what `categories.keyword_category` says of it (a test checks this).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from apex_jax.datasets import world_records as R
from apex_jax.datasets.records import DatasetError, Hop, QAExample, SupportingFact
from apex_jax.datasets.world_checks import NAMED_ANSWER_FORBIDDEN, contains
from apex_jax.datasets.world_records import PROCEDURES
from apex_jax.memory.schema import CATEGORIES

# relation -> (query format, fact key); the fact is stated in the current entity's passage.
FORWARD = {
    "born_in": ("{} birthplace", "born_in"), "birth_year": ("{} birth year", "birth_year"),
    "occupation": ("{} occupation", "occupation"), "employer": ("{} employer", "employer"),
    "country": ("{} country", "country"), "population": ("{} population", "population"),
    "river": ("river through {}", "river"), "length": ("{} river length", "length"),
    "n_cities": ("{} number of cities", "cities"), "director": ("{} film director", "director"),
    "release_year": ("{} film release year", "year"), "founder": ("{} company founder", "founder"),
    "product": ("{} company product", "product"), "hq": ("{} headquarters", "hq"),
    "kind": ("{} kind of object", "kind"), "use": ("{} used for", "use"),
    "method": ("{} how made", "method"),
}
# relation -> (query format, kind, fact key): the entity of `kind` whose fact points back here.
REVERSE = {"event_won": ("event won by {}", "event", "winner"),
           "event_in": ("event held in {}", "event", "city")}
# Answers as a person might phrase them, besides the literal of the passage.
_PREFIX = {"use": "to ", "method": "by ", "kind": "a "}

# (category, question format, anchor kind, relations)
CHAINS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("location", "In which city was {} born?", "person", ("born_in",)),
    ("location", "In which city are the headquarters of {}?", "company", ("hq",)),
    ("location", "In which country was {} born?", "person", ("born_in", "country")),
    ("location", "In which country was the director of the film {} born?", "film",
     ("director", "born_in", "country")),
    ("human", "Who directed the film {}?", "film", ("director",)),
    ("human", "Who founded the employer of {}?", "person", ("employer", "founder")),
    ("human", "Who founded the employer of the director of the film {}?", "film",
     ("director", "employer", "founder")),
    ("time", "In which year was {} born?", "person", ("birth_year",)),
    ("time", "In which year was the director of the film {} born?", "film",
     ("director", "birth_year")),
    ("time", "In which year was the founder of the employer of {} born?", "person",
     ("employer", "founder", "birth_year")),
    ("career", "What is the occupation of {}?", "person", ("occupation",)),
    ("career", "What is the occupation of the director of the film {}?", "film",
     ("director", "occupation")),
    ("career", "What is the occupation of the founder of the employer of {}?", "person",
     ("employer", "founder", "occupation")),
    ("process", "How is the {} made?", "product", ("method",)),
    ("process", "How is the product of {} made?", "company", ("product", "method")),
    ("process", "How is the product of the employer of {} made?", "person",
     ("employer", "product", "method")),
    ("definition", "What kind of object is the {}?", "product", ("kind",)),
    ("definition", "What kind of object does {} make?", "company", ("product", "kind")),
    ("definition", "What kind of object does the employer of {} make?", "person",
     ("employer", "product", "kind")),
    ("event", "Which event did {} win?", "person", ("event_won",)),
    ("event", "Which event was won by the director of the film {}?", "film",
     ("director", "event_won")),
    ("event", "Which event was held in the birth city of {}?", "person", ("born_in", "event_in")),
    ("event", "Which event was held in the birth city of the director of the film {}?", "film",
     ("director", "born_in", "event_in")),
    ("function", "What is the {} used for?", "product", ("use",)),
    ("function", "What is the product of {} used for?", "company", ("product", "use")),
    ("function", "What is the product of the employer of {} used for?", "person",
     ("employer", "product", "use")),
    ("property", "How many people live in {}?", "city", ("population",)),
    ("property", "How many cities does {} have?", "country", ("n_cities",)),
    ("property", "How many km long is the river {}?", "river", ("length",)),
    ("property", "How many people live in the birth city of {}?", "person",
     ("born_in", "population")),
    ("property", "How many km long is the river that flows through {}?", "city",
     ("river", "length")),
    ("property", "How many km long is the river that flows through the birth city of {}?",
     "person", ("born_in", "river", "length")),
)


def walk(world, start: str, relations: Sequence[str]) -> tuple[list[Hop], str] | None:
  """The hops from entity `start` along `relations` and the final entity id (or literal), or None
  where a reverse relation finds no entity (this city held no event)."""
  hops, current = [], start
  for relation in relations:
    name = world.name(current)
    if relation in REVERSE:
      query, kind, key = REVERSE[relation]
      found = [i for i in world.of_kind(kind) if world.entities[i].facts[key] == current]
      if not found:
        return None
      current = found[0]
      hops.append(world.hop(current, query.format(name), world.name(current)))
      continue
    if world.records and _recorded(world, current, relation):
      hops.extend(_record_hops(world, current, relation))
      current = hops[-1].answer
      continue
    query, key = FORWARD[relation]
    value = world.entities[current].facts[key]
    if relation == "n_cities":
      value = len(value)
    is_entity = isinstance(value, str) and value in world.entities
    hops.append(world.hop(current, query.format(name),
                          world.name(value) if is_entity else str(value)))
    current = value if is_entity else str(value)
  return hops, current


def _recorded(world, entity_id: str, relation: str) -> bool:
  return PROCEDURES.get(world.entities[entity_id].kind, (None,))[0] == relation


def _record_hops(world, entity_id: str, relation: str) -> list[Hop]:
  """A recorded fact's two hops: the entity's record listing (the answer: the listed words), then
  the record of its category's procedure word (the answer: the fact)."""
  name, records = world.name(entity_id), world.records[entity_id]
  word = world.procedure_words[R.PROCEDURES[world.entities[entity_id].kind][1]]
  record = next(r for r in records if r.word == word)
  return [Hop(R.listing_query(name), R.listing_id(entity_id), R.listing_title(name),
              R.listing(records)),
          Hop(R.record_query(name, word), record.passage_id, R.record_title(name, word),
              record.value)]


def _chain(world, rng, template) -> tuple | None:
  category, question, kind, relations = template
  anchor = rng.choice(world.of_kind(kind))
  walked = walk(world, anchor, relations)
  if walked is None:
    return None
  hops, _ = walked
  read = [world.entity_of(h.passage_id) for h in hops]
  read = [e for k, e in enumerate(read) if k == 0 or e != read[k - 1]]  # a listing, its record
  if len(set(read)) < len(read):
    return None  # an entity read twice (its passage, later its records): rejected as without
    # procedures, so that both worlds ask the same questions
  answer = hops[-1].answer
  aliases = (answer, _PREFIX[relations[-1]] + answer) if relations[-1] in _PREFIX else (answer,)
  return _example(question.format(world.name(anchor)), aliases, category, "chain", hops)


def _example(question, answers, category, kind, hops) -> tuple | None:
  """A draft (question, answers, category, kind, hops), or None where two hops read one passage
  (then it is not a real multi-hop question) or the question names its own answer ("Who founded
  the employer of X?" when X founded it)."""
  if len({h.passage_id for h in hops}) != len(hops):
    return None
  if kind in NAMED_ANSWER_FORBIDDEN and contains(question, answers[0]):
    return None
  return question, tuple(answers), category, kind, tuple(hops)


def _age(world, rng):
  film = rng.choice(world.of_kind("film"))
  director = world.entities[film].facts["director"]
  (year,), _ = walk(world, film, ("release_year",))
  (born,), _ = walk(world, director, ("birth_year",))
  return _example(f"How old was {world.name(director)} when the film {world.name(film)} was "
                  "released?", (str(int(year.answer) - int(born.answer)),), "time", "age",
                  [year, born])


def _before(world, rng):
  people = world.of_kind("person")
  if rng.random() < 0.5:  # the 3-hop form reaches the first person through a film
    film = rng.choice(world.of_kind("film"))
    first, other = world.entities[film].facts["director"], rng.choice(people)
    head, _ = walk(world, film, ("director", "birth_year"))
    subject = f"the director of the film {world.name(film)}"
  else:
    first, other = rng.sample(people, 2)
    head, _ = walk(world, first, ("birth_year",))
    subject = world.name(first)
  (tail,), _ = walk(world, other, ("birth_year",))
  if first == other or head[-1].answer == tail.answer:
    return None
  yes = int(head[-1].answer) < int(tail.answer)
  return _example(f"Was {subject} born before {world.name(other)}?", ("yes" if yes else "no",),
                  "others", "before", head + [tail])


def _first(world, rng):
  a, b = rng.sample(world.of_kind("film"), 2)
  (ya,), _ = walk(world, a, ("release_year",))
  (yb,), _ = walk(world, b, ("release_year",))
  if ya.answer == yb.answer:
    return None
  earlier = world.name(a) if int(ya.answer) < int(yb.answer) else world.name(b)
  return _example(f"Which film was released first, {world.name(a)} or {world.name(b)}?",
                  (earlier,), "others", "first", [ya, yb])


def _same(world, rng):
  a = rng.choice(world.of_kind("person"))
  same_city = [p for p in world.of_kind("person") if p != a and
               world.entities[p].facts["born_in"] == world.entities[a].facts["born_in"]]
  others = [p for p in world.of_kind("person") if p != a]
  b = rng.choice(same_city if same_city and rng.random() < 0.5 else others)
  (ha,), _ = walk(world, a, ("born_in",))
  (hb,), _ = walk(world, b, ("born_in",))
  return _example(f"Were {world.name(a)} and {world.name(b)} born in the same city?",
                  ("yes" if ha.answer == hb.answer else "no",), "others", "same", [ha, hb])


Template = Callable[[object, random.Random], tuple | None]
TEMPLATES: dict[str, list[Template]] = {c: [] for c in CATEGORIES}
for _t in CHAINS:
  TEMPLATES[_t[0]].append(lambda w, r, t=_t: _chain(w, r, t))
TEMPLATES["time"].append(_age)
TEMPLATES["others"].extend([_before, _first, _same])


def generate(world, rng: random.Random, num_questions: int,
             patience: int = 200) -> list[QAExample]:
  """`num_questions` distinct questions, the categories taken in turn (so all ten appear once
  there are ten questions), a template and anchor drawn at random for each. A category that
  gives no new question in `patience` draws is used up and skipped from then on."""
  if isinstance(num_questions, bool) or not isinstance(num_questions, int) or num_questions < 1:
    raise DatasetError(f"num_questions must be an integer >= 1; got {num_questions!r}")
  seen, out, active, turn = set(), [], list(CATEGORIES), 0
  while len(out) < num_questions:
    if not active:
      raise DatasetError(f"num_questions {num_questions} is more distinct questions than this "
                         f"world of {len(world.entities)} entities gives ({len(out)}); use more "
                         "entities or fewer questions")
    category = active[turn % len(active)]
    for _ in range(patience):
      draft = rng.choice(TEMPLATES[category])(world, rng)
      if draft is not None and draft[0] not in seen:
        break
    else:
      active.remove(category)
      continue
    turn += 1
    question, answers, category, kind, hops = draft
    seen.add(question)
    out.append(QAExample(
        id=f"world{world.seed}-{len(out)}", question=question, answers=answers,
        category=category, hops=len(hops),
        passages=tuple(world.passage(h.passage_id) for h in hops), kind=kind, chain=hops,
        supporting=tuple(_fact(world, h) for h in hops)))
  return out


def _fact(world, hop: Hop) -> SupportingFact:
  """The supporting fact of a hop: its passage's first sentence that states the answer."""
  sentences = world.sentences[hop.passage_id]
  index = next((i for i, s in enumerate(sentences) if hop.answer in s), 0)
  return SupportingFact(hop.title, index)


def split(examples: Sequence[QAExample], test_fraction: float, seed: int,
          holdout_categories: Sequence[str] = ()) -> tuple[list[QAExample], list[QAExample]]:
  """(train, test): every question of `holdout_categories` goes to test; of the rest, a
  seeded random `test_fraction` of the question instances does too. File order is kept."""
  if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or \
      not 0 <= test_fraction < 1:
    raise DatasetError(f"test_fraction must be a number in [0, 1); got {test_fraction!r}")
  unknown = [c for c in holdout_categories if c not in CATEGORIES]
  if unknown:
    raise DatasetError(f"holdout_categories: {unknown[0]!r} is not one of {', '.join(CATEGORIES)}")
  rest = [i for i, e in enumerate(examples) if e.category not in holdout_categories]
  chosen = set(random.Random(seed).sample(rest, round(test_fraction * len(rest))))
  test = {i for i, e in enumerate(examples) if e.category in holdout_categories} | chosen
  return ([e for i, e in enumerate(examples) if i not in test],
          [e for i, e in enumerate(examples) if i in test])
