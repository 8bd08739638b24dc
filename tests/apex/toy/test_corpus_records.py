"""The APEx corpus of worlds with procedures: the executor follows a plan naming the record word
and otherwise guesses a listed record, memories keep the searched queries, the planner names the
word only when a positive memory (or the skill) it is shown does, the skill keeps the word; and
nothing of it reaches the demo's world or the pipeline."""

import collections
import dataclasses
import hashlib
import json
import os
import re

import pytest

from apex_jax.agents import prompts
from apex_jax.datasets.world import World
from apex_jax.memory.records import Memory
from apex_jax.toy import build, corpus
from apex_jax.tools import Answer, ToolCall, parse_turn
from tests.apex.toy.conftest import COMPACT, REPO


@pytest.fixture(scope="module")
def pworld():
  return World.generate(7, 60, 120, procedures=True)


@pytest.fixture(scope="module")
def turns(pworld):
  return build.world_turns(pworld, COMPACT, seed=7)


def _replies(turn):
  return [turn["target"]] + [r["target"] for r in turn["rounds"]]


def _records_of(world, example):
  hop = example.chain[corpus.record_step(example)]
  return next(rs for rs in world.records.values() if hop.passage_id in [r.passage_id for r in rs])


def test_off_is_the_corpus_of_before(compact):
  # digest of build.world_turns(World.generate(7, 60, 80), COMPACT, seed=7) before the option
  digest = hashlib.sha256(json.dumps(compact[0], sort_keys=True).encode()).hexdigest()[:16]
  assert digest == "3398cd6fcfafee4f"


def test_executor_follows_a_word_plan_and_guesses_without_one(pworld, turns):
  by_id, guesses = {e.id: e for e in pworld.examples}, collections.Counter()
  executed = [t for t in turns[0] if t["role"] == "apex_execute"
              and corpus.record_step(by_id[t["example_id"]]) is not None]
  assert executed
  for turn in executed:
    ex = by_id[turn["example_id"]]
    records, k = _records_of(pworld, ex), corpus.record_step(ex)
    parsed = [parse_turn(r) for r in _replies(turn)]
    assert all(isinstance(p, ToolCall) for p in parsed[:-1]) and isinstance(parsed[-1], Answer)
    queries = [p.queries[0] for p in parsed[:-1]]
    assert queries[:k] == [h.query for h in ex.chain[:k]]
    word = queries[k][:-len(" record")].rsplit(" ", 1)[1]
    assert word in [r.word for r in records]
    assert parsed[-1].text == next(r.value for r in records if r.word == word)
    plan = turn["messages"][-1]["content"].partition("\nPlan:\n")[2]
    if re.search(r'[a-z]+ record"', plan):  # the plan names the word: the run follows it
      assert queries == [h.query for h in ex.chain] and parsed[-1].text == ex.answers[0]
      guesses["followed"] += 1
    else:
      assert "one record of" in plan or not plan
      guesses["right" if parsed[-1].text == ex.answers[0] else "wrong"] += 1
  assert guesses["followed"] and guesses["right"] and guesses["wrong"] > guesses["right"], guesses


def test_first_guess_reads_the_first_listed_record(pworld):
  """record_guess="first": a run without the word in its plan reads the listing's first record,
  a different word for different entities (the listings are shuffled), never a random one."""
  turns, _ = build.world_turns(pworld, COMPACT, corpus.CorpusConfig(record_guess="first"), seed=7)
  by_id, words = {e.id: e for e in pworld.examples}, collections.Counter()
  for turn in (t for t in turns if t["role"] == "apex_execute"):
    ex = by_id[turn["example_id"]]
    k = corpus.record_step(ex)
    plan = turn["messages"][-1]["content"].partition("\nPlan:\n")[2]
    if k is None or re.search(r'[a-z]+ record"', plan):
      continue
    query = [parse_turn(r).queries[0] for r in _replies(turn)[:-1]][k]
    first = _records_of(pworld, ex)[0].word
    assert query == f"{corpus.record_entity(ex.chain[k].query)} {first} record", query
    words[first] += 1
  assert len(words) >= 2, words
  with pytest.raises(ValueError, match="CorpusConfig.record_guess must be one of"):
    corpus.CorpusConfig(record_guess="last")


def test_memories_and_summaries_keep_the_searched_record(pworld, turns):
  summaries = [t for t in turns[0] if t.get("summary")]
  by_id = {e.id: e for e in pworld.examples}
  seen = set()
  for t in summaries:
    ex = by_id[t["example_id"].split(":", 1)[1]]
    if corpus.record_step(ex) is None:
      continue
    searched = re.findall(r'search\("([^"]*) record"\)', t["target"])
    words = {s.rsplit(" ", 1)[1] for s in searched}
    assert words <= set(r.word for r in _records_of(pworld, ex)), t["target"]
    seen |= words
    assert searched == [q for q in re.findall(r'"query_list": \["([^"]*) record"\]',
                                              t["messages"][0]["content"])]
  assert len(seen) > 1  # right and wrong records are remembered


def _memory(i, category, question, workflow, correct):
  return Memory(i, category, corpus.MODALITY, question, workflow,
                "correct" if correct else "incorrect")


def test_planner_names_the_word_iff_a_positive_memory_shows_it(pworld, turns):
  by_id = {e.id: e for e in pworld.examples}
  plans = [t for t in turns[0] if t["role"] == "apex_plan"
           and corpus.record_step(by_id[t["example_id"]]) is not None]
  named = 0
  for t in plans:
    ex, prompt = by_id[t["example_id"]], t["messages"][1]["content"]
    positive = prompt.split("#### Negative Examples")[0].split("Memories:", 1)[1]
    skill = prompt.split("Memories:", 1)[0]
    shown = set(re.findall(r'([a-z]+) record"', positive)) or set(
        re.findall(r'([a-z]+) record"', skill))
    steps = prompts.after_think(t["target"]).splitlines()
    step = steps[corpus.record_step(ex)]
    if shown:
      assert shown == {pworld.procedure_words[ex.category]}  # positives come from right runs
      assert step.endswith(f' {pworld.procedure_words[ex.category]} record".'), (step, shown)
      named += 1
    else:
      assert "one record of" in step and not re.search(r'[a-z]+ record"', t["target"])
  assert 0 < named < len(plans)


def test_planner_copies_the_word_from_the_memory_text(pworld):
  ex = next(e for e in pworld.examples if e.category == "career" and e.hops == 2)
  name = ex.chain[0].query[:-len(" records")]
  wf = '1. search("Pamo Kis records")\n2. search("Pamo Kis {} record")\n3. answer \'x\''
  good = _memory(1, "career", "What is the occupation of Pamo Kis?", wf.format("zubzub"), True)
  bad = _memory(2, "career", "What is the occupation of Tel Vo?", wf.format("nonon"), False)
  for earlier, word in (([good, bad], "zubzub"), ([bad], None), ([], None)):
    context = corpus.planner_context("career", earlier, with_skill=False)
    turn = corpus.planner_conversation(ex, [], 0, True, COMPACT, context)
    step = prompts.after_think(turn["target"]).splitlines()[1]
    assert step == (f'2. Search "{name} {word} record".' if word else
                    f"2. Search one record of {name}."), (earlier, step)


def test_noisy_memories_drop_or_garble_the_word_and_the_plan_follows_the_positives(pworld):
  wf = '1. search("Pamo Kis records")\n2. search("Pamo Kis zubzub record")\n3. answer \'x\''
  rng, damaged = __import__("random").Random(0), collections.Counter()
  for _ in range(40):
    noisy = corpus.noisy_workflow(wf, rng)
    first, second, third = noisy.splitlines()
    assert (first, third) == tuple(wf.splitlines()[::2])  # only the record search changes
    word = re.fullmatch(r'2\. search\("Pamo Kis ?([a-z]*) record"\)', second).group(1)
    kind = "dropped" if not word else "garbled"
    assert not word or (len(word) == 6 and sum(a != b for a, b in zip(word, "zubzub")) == 1)
    damaged[kind] += 1
  assert damaged["dropped"] > 5 and damaged["garbled"] > 5
  # a positive memory without a word and a negative with one: the generic record step
  ex = next(e for e in pworld.examples if e.category == "career" and e.hops == 2)
  good = _memory(1, "career", "q1", wf.replace(" zubzub record", " record"), True)
  bad = _memory(2, "career", "q2", wf.replace("zubzub", "nonon"), False)
  turn = corpus.planner_conversation(ex, [], 0, True, COMPACT,
                                     corpus.planner_context("career", [good, bad], False))
  assert "one record of" in prompts.after_think(turn["target"]).splitlines()[1]
  noisy_config = corpus.CorpusConfig(memory_noise=1.0)
  stats = build.world_turns(pworld, COMPACT, noisy_config, seed=7)[1]
  assert stats["memory_noisy"] > 10
  with pytest.raises(ValueError, match="memory_noise must be in"):
    corpus.CorpusConfig(memory_noise=1.5)


def test_skill_keeps_a_correct_workflow_record_word():
  wf = '1. search("Kalkar Rula records")\n2. search("Kalkar Rula {} record")\n3. answer \'x\''
  good = _memory(1, "career", "q1", wf.format("vesk"), True)
  bad = _memory(2, "career", "q2", wf.format("dorn"), False)
  skill = corpus.skill_reply("career", [bad, good], None, [])["skill"]
  assert skill["procedure"][1]["action"] == 'search("X vesk record")'
  generic = corpus.skill_reply("career", [bad], None, [])["skill"]
  assert generic["procedure"][1]["action"] == "search one record of X"
  refined = corpus.skill_reply("career", [good], generic, [])["skill"]
  assert refined["procedure"][1]["action"] == 'search("X vesk record")'
  kept = corpus.skill_reply("career", [bad], skill, [])["skill"]
  assert kept["procedure"] == skill["procedure"]
  skill_text, _ = corpus.planner_context("career", [good], with_skill=True)
  assert corpus.shown_record_word(skill_text, "None found.") == "vesk"


def test_distiller_replies_of_procedure_worlds_apply(turns):
  skills = [t for t in turns[0] if t["role"] == "apex_distill" and not t.get("summary")]
  assert skills and turns[1]["distill"] == len(skills)  # each applied strictly when built


def test_no_toy_world_is_the_demo_world():
  """The toy runs train and hold out worlds seed * 1000 + i and 100000 + seed; the demo's world
  is none of them, so its episodes are the only source of its memories."""
  from configs.apex import demo_cpu
  from configs.toy import apex as toy_apex

  demo = demo_cpu.get_config().data.world_seed
  for run in toy_apex.RUNS:
    c = toy_apex.get_config(str(run))
    train, held = build.world_seeds(c.toy.seed, c.data.worlds)
    assert demo not in train + held, (run, train, held)


# the world's record tables, its records module, a gold chain; `.records` but the modules
# memory.records and datasets.records
_ORACLE = re.compile(r"procedure_words|record_words|world_records|\.chain\b|\.supporting\b|"
                     r"(?<!memory)(?<!datasets)\.records\b")


def test_the_pipeline_never_reads_the_record_table_or_gold_chains():
  """What the pipeline hands the agents comes from the questions and its own episodes: no
  module of it reads the world's record words or a gold chain (which names the right word)."""
  root = os.path.join(REPO, "apex_jax")
  files = [os.path.join(root, f) for f in ("pipeline.py", "experiment.py")]
  for package in ("agents", "memory", "training", "judges", "tools"):
    folder = os.path.join(root, package)
    files += [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")]
  for path in files:
    text = open(path, encoding="utf-8").read()
    assert not _ORACLE.search(text), (path, _ORACLE.search(text))


def test_plan_steps_of_a_record_chain(pworld):
  ex = next(e for e in pworld.examples if e.category == "property" and e.hops == 4)
  word = pworld.procedure_words["property"]
  named, generic = corpus.plan_steps(ex, word), corpus.plan_steps(ex)
  assert named[2] == 'Search "<result of step 2> records".'
  assert named[3] == f'Search "<result of step 2> {word} record".'
  assert generic[3] == "Search one record of <result of step 2>."
  assert named[:3] == generic[:3] and named[4] == generic[4] == "Answer with the result of step 4."
  again = corpus.reread(ex, _records_of(pworld, ex), word)
  assert again.chain == ex.chain and again.answers == (ex.answers[0],)
  assert dataclasses.replace(ex, answers=ex.answers[:1]) == again


def test_a_bank_shows_the_planner_what_the_corpus_assumes(pworld, tmp_path):
  """At run time a memory's workflow is the Distiller's summary (trained to equal
  corpus.workflow of the run): stored in a bank and laid out by planner_context and
  context_slots, a right run's word reaches the plan prompt where the corpus planner reads it,
  and a wrong run's word alone does not."""
  from apex_jax.agents.planner import context_slots
  from apex_jax.memory import MemoryBank, NewMemory
  from apex_jax.tools.overlap import WordSearch
  from tests.apex.memory.fakes import HashEmbedder

  searcher = WordSearch(pworld.passages, COMPACT.topk)
  asked, *earlier = [e for e in pworld.examples if e.category == "career"][:3]
  word = pworld.procedure_words["career"]
  wrong = next(w for w in pworld.record_words["career"] if w != word)
  for outcomes, shown in (((True, False), word), ((False, False), None)):
    with MemoryBank(str(tmp_path / f"{outcomes}.db"), HashEmbedder()) as bank:
      for ex, right in zip(earlier, outcomes):
        run = corpus.executor_rounds(corpus.reread(ex, _records_of(pworld, ex),
                                                   word if right else wrong), searcher, COMPACT)
        bank.add_many([NewMemory(ex.question, corpus.workflow(run), right, category="career",
                                 modality=corpus.MODALITY)])
      skill, memory = context_slots(bank.planner_context(asked.question, category="career",
                                                         modality=corpus.MODALITY))
    assert corpus.shown_record_word(skill, memory) == shown, memory
    turn = corpus.planner_conversation(asked, [], 0, True, COMPACT, (skill, memory))
    assert turn["messages"][1]["content"].count("Workflow Summary") == 2
    assert (f' {word} record".' in turn["target"]) == (shown is not None), turn["target"]


def test_fresh_record_words_are_swapped_consistently(pworld):
  """fresh_record_words=1: a procedure category's plan prompts with memories name none of the
  world's record words; a plan naming a word names one its prompt's positive memories show."""
  turns, stats = build.world_turns(pworld, COMPACT, corpus.CorpusConfig(fresh_record_words=1.0),
                                   seed=7)
  assert stats["plan_fresh_words"] > 0
  world_words = {w for ws in pworld.record_words.values() for w in ws}
  named = 0
  for turn in (t for t in turns if t["role"] == "apex_plan"):
    prompt = turn["messages"][-1]["content"]
    if "Positive Examples" not in prompt or " record\")" not in prompt:
      continue
    text = prompt + turn["target"] + "".join(r["target"] for r in turn.get("rounds", ()))
    assert not world_words & set(re.findall(r"[a-z]+", text)), text
    plan_word = re.findall(r'([a-z]+) record"', turn["target"])
    if plan_word:
      positive = prompt.split("#### Negative Examples")[0]
      assert plan_word[0] in re.findall(r'([a-z]+) record"', positive)
      named += 1
  assert named
  assert corpus.swap_words({"messages": [{"role": "user", "content": "a vesk vesky"}],
                            "target": "vesk"}, {"vesk": "dorn"}) == {
      "messages": [{"role": "user", "content": "a dorn vesky"}], "target": "dorn"}


def test_decoy_negatives_show_wrong_record_runs_and_the_plan_keeps_the_positive_word(pworld):
  """context_negatives=2, decoy_negatives: plan prompts show up to two incorrect memories,
  wrong-record runs first, so more of them show a decoy word next to the positive one; the plan
  names the positive memory's word, never a word only a negative shows."""
  def decoy_prompts(config):
    turns, stats = build.world_turns(pworld, COMPACT, config, seed=7)
    shown, counts = 0, collections.Counter()
    for turn in (t for t in turns if t["role"] == "apex_plan"):
      prompt = turn["messages"][-1]["content"]
      if "#### Negative Examples" not in prompt:
        continue
      positive, negative = prompt.split("#### Negative Examples")
      counts[negative.count("Question:")] += 1
      decoys = set(corpus.RECORD_WORD.findall(negative)) - set(
          corpus.RECORD_WORD.findall(positive))
      plan_words = set(re.findall(r'([a-z]+) record"', turn["target"]))
      assert not plan_words & decoys, (plan_words, decoys)
      shown += bool(decoys)
    return shown, stats, counts

  before, _, one = decoy_prompts(corpus.CorpusConfig())
  after, stats, two = decoy_prompts(corpus.CorpusConfig(context_negatives=2,
                                                        decoy_negatives=True))
  assert after > before > 0 and stats["plan_decoy_negatives"] >= after
  assert max(two) > max(one)  # two negatives shown where there were two
  with pytest.raises(ValueError, match="context_negatives must be an integer >= 0"):
    corpus.CorpusConfig(context_negatives=-1)
