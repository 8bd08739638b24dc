"""Reading drills: every reply answers its question with the hop's gold fact, which the drill's
tool output shows; the questions are not in the order of the searches; the corpus adds them only
when asked."""

import random

import pytest

from apex_jax.toy import build, corpus, reading
from apex_jax.tools.overlap import WordSearch
from apex_jax.tools import Answer, parse_turn
from tests.apex.toy.conftest import COMPACT


def _replies(turn):
  return [turn["target"]] + [r["target"] for r in turn["rounds"]]


def _questions(turn):
  first = turn["messages"][0]["content"].rsplit("\nQuestion: ", 1)[1]
  return [first] + [r["messages"][0]["content"].removeprefix("Question: ")
                    for r in turn["rounds"]]


def test_each_reply_copies_its_hops_fact_from_the_tool_output(world):
  drills, missed = reading.drills(world.examples, WordSearch(world.passages, 2), COMPACT,
                                  random.Random(0), per_drill=3)
  hops = {h.query: h for h in reading.world_hops(world.examples)}
  assert len(drills) + missed == len(hops) // 3 and len(drills) >= 0.8 * (len(hops) // 3)
  shuffled = 0
  for turn in drills:
    tool = turn["messages"][0]["content"]
    assert tool.startswith("<tool_response>\nA search for ")
    searched = [line.split("'")[1] for line in tool.splitlines() if line.startswith("A search")]
    asked = _questions(turn)
    assert sorted(asked) == sorted(searched) and len(asked) == 3
    shuffled += asked != searched
    for query, reply in zip(asked, _replies(turn)):
      parsed = parse_turn(reply)
      assert isinstance(parsed, Answer) and parsed.text == hops[query].answer
      assert parsed.think == f"{query}: {hops[query].answer}."
      assert hops[query].answer in tool  # copyable: the fact is in the shown passages
  assert shuffled > 0.5 * len(drills)


def test_corpus_adds_drills_only_when_asked(world):
  plain, stats = build.world_turns(world, COMPACT, seed=7)
  assert "apex_read" not in {t["role"] for t in plain} and not stats["reading"]
  drilled, stats = build.world_turns(world, COMPACT, corpus.CorpusConfig(reading_hops=2), seed=7)
  drills = [t for t in drilled if t["role"] == "apex_read"]
  assert len(drills) == stats["reading"] > 0
  assert all(len(t["rounds"]) == 1 for t in drills)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_hops_per_drill_is_named(bad):
  with pytest.raises(ValueError, match="reading_hops"):
    corpus.CorpusConfig(reading_hops=bad)


def test_reading_prompts_stop_right_before_each_gold_reply(world, toy_tok):
  """The teacher-forced prompt + the gold reply + <|im_end|> is the encoded gold run up to that
  reply's end, for every reply after a tool output (search queries, then the answer)."""
  from apex_jax.toy import encode
  from apex_jax.toy.reading import reading_prompts

  examples = world.examples[:12]
  searcher = WordSearch(world.passages, 2)
  rows = reading_prompts(examples, searcher, COMPACT, toy_tok)
  im_end = toy_tok.hf.convert_tokens_to_ids("<|im_end|>")
  runs = {e.id: corpus.executor_rounds(e, searcher, COMPACT) for e in examples}
  assert len(rows) == sum(e.hops for e in examples if runs[e.id] is not None)
  seen = {}
  for prompt, kind, gold, ex in rows:
    k = seen[ex.id] = seen.get(ex.id, 0) + 1
    tokens, _, ends = encode.encode_rounds(
        corpus.executor_conversation(ex, runs[ex.id], None, COMPACT), toy_tok)
    reply = runs[ex.id][k]["text"]
    assert prompt + toy_tok.encode(reply) + [im_end] == [int(t) for t in tokens[:ends[k]]]
    assert kind == ("answer" if k == ex.hops else "query")
    assert gold == (ex.answers[0] if k == ex.hops else ex.chain[k].query)
    assert gold in reply


def test_spaced_copies_have_the_pieces_of_what_they_copy(world):
  """With spaced copies, the committed toy's BPE splits each query and answer into the pieces of
  the question / passages it copies (without, the first word splits differently); the parsers
  read the same query and answer either way."""
  from transformers import AutoTokenizer

  from tests.apex.toy.conftest import REPO

  tok = AutoTokenizer.from_pretrained(f"{REPO}/assets/toy_apex")
  pieces = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
  contains = lambda seq, sub: any(seq[i:i + len(sub)] == sub  # noqa: E731
                                  for i in range(len(seq) - len(sub) + 1))
  searcher = WordSearch(world.passages, 2)
  differs = 0
  chains = [e for e in world.examples if e.kind == "chain"][:20]  # the answer is a passage's
  for ex in chains:
    plain = corpus.executor_rounds(ex, searcher, COMPACT)
    spaced = corpus.executor_rounds(ex, searcher, COMPACT, spaced=True)
    if plain is None:
      continue
    assert [parse_turn(t["text"]) for t in plain] == [
        parse_turn(t["text"].replace('[" ', '["').replace("<answer> ", "<answer>"))
        for t in spaced]
    answer = parse_turn(spaced[-1]["text"])
    assert answer.text == ex.answers[0] == parse_turn(plain[-1]["text"]).text
    source = pieces(spaced[-2]["tool_output"])  # the last search's results hold the answer
    assert contains(source, pieces(f" {ex.answers[0]}"))
    tail = lambda turn: turn["text"].split("</think>")[1]  # noqa: E731  the <answer> block
    assert contains(pieces(tail(spaced[-1])), pieces(f" {ex.answers[0]}"))
    differs += not contains(pieces(tail(plain[-1])), pieces(f" {ex.answers[0]}"))
    first = parse_turn(spaced[0]["text"]).queries[0]
    assert first == f" {ex.chain[0].query}"
  assert differs >= 10  # the unspaced answer's pieces are not the passage's
