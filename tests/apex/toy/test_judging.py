"""The toy's judge conversations are the TTRL judges' own prompts on the world's traces, and every
reply reads back, through the judges' parsers, as the label the corpus meant."""

import collections

import pytest

from apex_jax.agents import prompts
from apex_jax.judges.align import AlignJudge
from apex_jax.judges.nogt import NoGtJudge
from apex_jax.toy import build, corpus, judging
from tests.apex.toy.conftest import COMPACT

JUDGED = corpus.CorpusConfig(judge_share=1.0, align_share=1.0)


@pytest.fixture(scope="module")
def judged(world):
  return build.world_turns(world, COMPACT, JUDGED, seed=7)


def _judge_turns(turns, judge):
  return [t for t in turns if t["role"] == "apex_judge" and t["judge"] == judge]


def test_default_corpus_has_no_judge_turns(compact):
  turns, stats = compact
  assert not [t for t in turns if t["role"] == "apex_judge"]
  assert "judge_nogt" not in stats and "judge_align" not in stats


def test_evaluator_and_arbiter_replies_parse_to_their_labels(judged):
  turns, stats = judged
  panel = NoGtJudge(backend=None)
  evaluators = [t for t in turns if t["role"] == "apex_judge"
                and t["judge"] in ("reasoning", "sourcing", "validity")]
  arbiters = _judge_turns(turns, "arbiter")
  assert len(evaluators) == len(arbiters) == stats["judge_nogt"] // 2 > 0
  assert {t["kind"] for t in arbiters} == {None, *corpus.CORRUPTIONS}
  for t in evaluators:
    result = panel.parse_evaluator(t["target"])
    assert result.failure is None
    assert (result.score, result.reason) == judging.SCORES[t["kind"]][t["judge"]]
  for t in arbiters:
    verdict, failure = panel.parse_verdict(t["target"])
    assert failure is None and verdict == ("correct" if t["kind"] is None else "incorrect")
  assert panel.evaluator_failures.total == panel.arbiter_failures.total == 0


def test_judges_read_the_trace_as_ttrl_renders_it(judged, world):
  turns, _ = judged
  examples = {ex.id: ex for ex in world.examples}
  t = next(t for t in _judge_turns(turns, "arbiter") if t["kind"] is None)
  ex = examples[t["example_id"].split(":", 1)[1]]
  text = t["messages"][0]["content"]
  assert t["messages"][0]["role"] == "user" and len(t["messages"]) == 1
  assert f"- User Question (Question): {ex.question}" in text
  assert f"- Agent Final Output (Final Output): {ex.answers[0]}\n" in text
  assert "### Round 1:\n#### Agent Reasoning and Tool Call:\n<think>" in text
  # the arbiter sees the three evaluator replies, weighted as the authors' prompt weights them
  for name, weight in zip(("reasoning", "sourcing", "validity"), ("0.5", "0.3", "0.2")):
    assert f"Importance Weight: {weight}): \n{judging.evaluator_reply(None, name)}" in text


def test_alignment_scores_count_search_steps():
  skill = {"procedure": [{"step": 1, "action": 'search("X birthplace")', "purpose": "p"},
                         {"step": 2, "action": 'search("<result> country")', "purpose": "p"},
                         {"step": 3, "action": "answer with the last fact found", "purpose": "p"}],
           "pitfalls": ["Answering without searching."]}
  two = '1. Search "A birthplace".\n2. Search "<result of step 1> country".\n3. Answer.'
  assert judging.alignment_score(two, skill) == 1.0
  assert judging.alignment_score('1. Search "A".\n2. Answer.', skill) == 0.5
  assert judging.alignment_score(two + '\n4. Search "B".\n5. Search "C".', skill) == 0.0
  assert judging.alignment_score("1. Answer with what you know.", skill) == 0.0


def test_alignment_replies_parse_to_their_scores(judged):
  turns, stats = judged
  align = AlignJudge(backend=None)
  items = _judge_turns(turns, "alignment")
  assert len(items) == stats["judge_align"] > 0
  counts = collections.Counter(t["score"] for t in items)
  assert set(counts) >= {1.0, 0.5}, counts
  for t in items:
    parsed = align.parse(t["target"])
    assert parsed.failure is None and parsed.score == t["score"]
    assert "**Generated Plan:**\n1. " in t["messages"][0]["content"]
  assert align.failures.total == 0


def test_final_output_is_the_answer_of_the_run():
  trace = [{"text": '<think>a</think>\n<tool_call>{"name": "search"}</tool_call>',
            "tool_output": "r"},
           {"text": "<think>b: Tomsa.</think>\n<answer>Tomsa Rilo</answer>", "tool_output": None}]
  assert judging.final_output(trace) == "Tomsa Rilo"
  assert prompts.render_trace("Q?", trace).startswith("### Question: Q?\n### Round 1:")
