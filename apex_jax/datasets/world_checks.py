"""The checks a synthetic world must pass before anyone trains on it.

- names: no two entities share a name, and no name word is used by two entities (so an answer
  string found in a passage names the intended entity);
- gold hops: each hop's passage exists, carries the hop's title and contains its answer as whole
  words;
- reachability: each hop's query names an entity that is known when the hop runs (named in the
  question, or the answer of an earlier hop), and the gold answer follows from the hops' answers
  by the question's kind (chain: the last answer; age: year difference; before / same: yes or no;
  first: the title of the earlier film);
- distinct hops: no two hops of a question read the same passage;
- no giveaway: a chain or age question does not name its own answer;
- size: questions of at most 30 words, passages of at most 60, 1 to 3 hops (4 with records);
- records (worlds with procedures, world_records): the record words are distinct, invented (no
  name word, no word of another passage, not English-like), each entity's record passages exist,
  its passage lists their words, exactly one record holds the true fact; and every gold hop onto
  a record finds that record first with the toy's word and trigram searches (topk 2);
- images (worlds with an image share, world_images): an image question has one image, its
  caption is an entity's emblem's (that entity is known: the image search names it), and neither
  the question nor the caption names a word of that entity's name.
"""

from __future__ import annotations

import collections
import re

from apex_jax.datasets import world_records as R
from apex_jax.datasets.world_emblems import shown
from apex_jax.datasets.world_words import ENGLISH_LIKE, EVENT_TYPES
from apex_jax.tools.overlap import NgramSearch, WordSearch

MAX_QUESTION_WORDS, MAX_PASSAGE_WORDS, MAX_HOPS = 30, 60, 3
# Kinds whose answer must not appear in the question ("first" names both films by design).
NAMED_ANSWER_FORBIDDEN = ("chain", "age")


def contains(text: str, phrase: str) -> bool:
  return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


def derived_answer(kind: str, hops) -> str:
  """The answer the hops' answers imply, for each question kind of `world_questions`."""
  answers = [h.answer for h in hops]
  if kind == "chain":
    return answers[-1]
  if kind == "age":
    return str(int(answers[0]) - int(answers[1]))
  if kind == "before":
    return "yes" if int(answers[-2]) < int(answers[-1]) else "no"
  if kind == "same":
    return "yes" if answers[-2] == answers[-1] else "no"
  if kind == "first":
    return hops[0].title if int(answers[0]) < int(answers[1]) else hops[1].title
  raise ValueError(f"unknown question kind {kind!r}")


def problems(world) -> list[str]:
  found: list[str] = []
  names = [e.name for e in world.entities.values()]
  if len(set(names)) != len(names):
    found.append("two entities share a name")
  words = [w for n in names for w in n.split()]
  counts = collections.Counter(words)
  repeated = {w for w, c in counts.items() if c > 1} - set(EVENT_TYPES)  # "X Race", "Y Race"
  if repeated:
    found.append(f"name words used by several entities: {sorted(repeated)[:5]}")
  for p in world.passages:
    if len(p.text.split()) > MAX_PASSAGE_WORDS:
      found.append(f"passage {p.id} has {len(p.text.split())} words")
  for example in world.examples:
    found.extend(f"{example.id}: {m}" for m in _example_problems(world, names, example))
  if world.records:
    found.extend(_record_problems(world, set(w.lower() for w in words)))
  return found


def _record_problems(world, name_words: set[str]) -> list[str]:
  out = []
  words = [w for ws in world.record_words.values() for w in ws]
  record_ids = {r.passage_id for rs in world.records.values() for r in rs}
  added = record_ids | {R.listing_id(i) for i in world.records}
  other = {w for i, sentences in world.sentences.items() if i not in added
           for t in sentences for w in re.findall(r"\w+", t.lower())}
  if len(set(words)) != len(words):
    out.append(f"record words repeat: {words}")
  for w in words:
    if w in name_words or w in ENGLISH_LIKE or w in other:
      out.append(f"record word {w!r} is a name word, English-like or in another passage")
  for i, records in world.records.items():
    e = world.entities[i]
    relation, category = R.PROCEDURES[e.kind]
    truth = R.fact_value(e, relation)
    if sorted(r.word for r in records) != sorted(world.record_words[category]):
      out.append(f"{i}: records {[r.word for r in records]} are not {category}'s words")
    listed = R.listing_id(i)
    if not world.has_passage(listed) or world.sentences[listed] != (
        f"Records of {e.name}: {R.listing(records)}.",):
      out.append(f"{i}: no listing passage {listed!r} of its records")
    if contains(world.passage(i).text, truth):
      out.append(f"{i}: its passage still states {truth!r}")
    if [r.value == truth for r in records] != [r.word == world.procedure_words[category]
                                               for r in records]:
      out.append(f"{i}: the true fact {truth!r} is not in the {category} procedure's record only")
    out.extend(f"{i}: record passage {r.passage_id!r} does not exist" for r in records
               if not world.has_passage(r.passage_id))
  hops = [h for ex in world.examples for h in ex.chain if h.passage_id in record_ids]
  for search in (WordSearch(world.passages, 2), NgramSearch(world.passages, 2)):
    found = search.search(sorted({h.query for h in hops}))
    first = {q: r[0].id for q, r in zip(sorted({h.query for h in hops}), found)}
    out.extend(f"{type(search).__name__}: {h.query!r} finds {first[h.query]!r} first, not "
               f"{h.passage_id!r}" for h in hops if first[h.query] != h.passage_id)
  return out



def _image_problems(world, example, entity: str) -> list[str]:
  out = [] if len(example.images) == 1 else [f"{len(example.images)} images, not 1"]
  words = world.name(entity).lower().split()
  text = f"{example.question} {example.caption}".lower()
  if any(contains(text, w) for w in words):
    out.append(f"the question or caption names the entity in its image ({world.name(entity)!r})")
  return out


def _example_problems(world, names, example) -> list[str]:
  out = []
  if len(example.question.split()) > MAX_QUESTION_WORDS:
    out.append(f"question has {len(example.question.split())} words")
  if example.kind in NAMED_ANSWER_FORBIDDEN and contains(example.question, example.answers[0]):
    out.append(f"the question names its own answer {example.answers[0]!r}")
  if len({h.passage_id for h in example.chain}) != len(example.chain):
    out.append("two hops read the same passage")
  if not 1 <= len(example.chain) <= MAX_HOPS + bool(world.records):
    out.append(f"{len(example.chain)} hops")
  known = [n for n in names if n in example.question and contains(example.question, n)]
  if example.images:
    entity = shown(world.emblems, example.caption)
    if entity is None:
      out.append(f"caption {example.caption!r} is no entity's emblem")
    else:  # the image search names it
      out.extend(_image_problems(world, example, entity))
      known.append(world.name(entity))
  for k, hop in enumerate(example.chain):
    if not world.has_passage(hop.passage_id):
      out.append(f"hop {k}: passage {hop.passage_id!r} does not exist")
      continue
    passage = world.passage(hop.passage_id)
    if passage.title != hop.title:
      out.append(f"hop {k}: title {hop.title!r} is not passage {passage.id}'s {passage.title!r}")
    if not contains(passage.text, hop.answer):
      out.append(f"hop {k}: answer {hop.answer!r} is not in passage {passage.id}")
    if not any(contains(hop.query, n) for n in known):
      out.append(f"hop {k}: query {hop.query!r} names nothing known at that point")
    known.append(hop.answer)
  if example.chain:
    derived = derived_answer(example.kind, example.chain)
    if derived not in example.answers:
      out.append(f"answer {example.answers!r} does not follow from the hops ({derived!r})")
  return out
