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
- size: questions of at most 30 words, passages of at most 60, 1 to 3 hops.
"""

from __future__ import annotations

import collections
import re

from apex_jax.datasets.world_words import EVENT_TYPES

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
  return found


def _example_problems(world, names, example) -> list[str]:
  out = []
  if len(example.question.split()) > MAX_QUESTION_WORDS:
    out.append(f"question has {len(example.question.split())} words")
  if example.kind in NAMED_ANSWER_FORBIDDEN and contains(example.question, example.answers[0]):
    out.append(f"the question names its own answer {example.answers[0]!r}")
  if len({h.passage_id for h in example.chain}) != len(example.chain):
    out.append("two hops read the same passage")
  if not 1 <= len(example.chain) <= MAX_HOPS:
    out.append(f"{len(example.chain)} hops")
  known = [n for n in names if n in example.question and contains(example.question, n)]
  for k, hop in enumerate(example.chain):
    if hop.passage_id not in world.entities:
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
