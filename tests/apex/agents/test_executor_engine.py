"""The executor on an engine (`Executor._flow`): each episode's next turn goes in as soon as its
tool call returns, with the key the lockstep loop gives it, so the trajectories equal the
lockstep path's (a keyed script here; a real tiny model in test_engine_generator.py)."""

import jax
import pytest

from apex_jax.agents import AgentConfig, Executor
from apex_jax.agents.turn_keys import TurnKeys
from apex_jax.tools import render_tool_call
from tests.apex.agents import fakes

RNG = jax.random.PRNGKey(7)
QUESTIONS = ["w40", "w41", "w42", "w43", "w44"]
ANSWER = "<think>w5</think><answer>w7</answer>"


def call(*queries):
  return f"<think>w9</think>{render_tool_call(list(queries))}"


def question_of(prompt):
  return next(q for q in QUESTIONS if q in prompt.split())


def keyed_reply(module, prompt, number):
  """A 'sampled' turn: the key alone picks it (answer, one or two searches, a malformed turn)."""
  return [ANSWER, call(f"w2{number % 7}"), "garbage", call("w30", f"w3{number % 5}"),
          call("w31")][number % 5]


class Lockstep(fakes.KeyedEngineGenerator):
  def on_engine(self):
    return False


def trajectories(generator, config):
  searcher = fakes.FakeSearcher()
  return Executor(generator, searcher, config).run(QUESTIONS, rng=RNG), searcher


def steps(module, prompt):
  """Engine steps a turn takes: differs per question and turn, so turns end out of order."""
  return 1 + (QUESTIONS.index(question_of(prompt)) * 3 + prompt.count("<|assistant|>")) % 4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_trajectories_equal_the_lockstep_path(temperature):
  config = AgentConfig(max_turns=4, temperature=temperature, on_format_error="feedback")
  want, want_searches = trajectories(Lockstep(keyed_reply), config)
  got, got_searches = trajectories(fakes.KeyedEngineGenerator(keyed_reply, steps), config)
  for a, b in zip(want, got):
    assert a.text == b.text and a.answer == b.answer and a.stats == b.stats
    assert [list(s.tokens) for s in a.segments] == [list(s.tokens) for s in b.segments]
    assert a.info["turns"] == b.info["turns"]
  # several numbers of turns and of tool calls, searched in other batches but the same queries
  assert len({t.stats["turns"] for t in got}) > 1 and len({t.stats["tool_calls"] for t in got}) > 1
  assert sorted(q for c in want_searches.calls for q in c) == sorted(
      q for c in got_searches.calls for q in c)


def test_a_short_episode_does_not_wait_for_a_long_turn():
  """Episode A's second turn is submitted (and A answers) while B's first turn still runs."""
  script = {"w40": [call("w20"), ANSWER], "w41": [ANSWER]}
  reply = lambda module, prompt, _: script[question_of(prompt)][prompt.count("<|assistant|>") - 1]
  gen = fakes.KeyedEngineGenerator(
      reply, steps=lambda module, prompt: 6 if question_of(prompt) == "w41" else 1,
      name=lambda prompt: f"{question_of(prompt)}.{prompt.count('<|assistant|>')}")
  for temperature in (0.0, 1.0):  # sampled: A's key needs no episode after it
    gen.events.clear()
    trajs = Executor(gen, fakes.FakeSearcher(), AgentConfig(temperature=temperature)).run(
        ["w40", "w41"], rng=RNG)
    assert [t.answer for t in trajs] == ["w7", "w7"]
    events = gen.events
    assert events.index(("submit", "w40.2")) < events.index(("done", "w41.1"))
    assert events.index(("done", "w40.2")) < events.index(("done", "w41.1"))


def test_turn_keys_follow_the_lockstep_rows():
  keys = TurnKeys(RNG, 3, greedy=False)
  row = lambda k, m: jax.random.key_data(jax.random.fold_in(jax.random.fold_in(RNG, k), m))
  same = lambda a, b: (jax.random.key_data(a) == b).all()
  assert all(same(keys.key(i), row(0, i)) for i in range(3))
  keys.record(2, ended=False)
  assert keys.key(2) is None  # runs 0 and 1 may or may not be active at round 1
  keys.record(0, ended=True)
  assert keys.key(2) is None  # run 1's first turn still runs
  keys.record(1, ended=False)
  # round 1: run 0 ended, run 1 is its call's row 0, run 2 its row 1
  assert same(keys.key(1), row(1, 0)) and same(keys.key(2), row(1, 1))
  greedy = TurnKeys(RNG, 3, greedy=True)
  greedy.record(2, ended=False)
  assert greedy.key(2) is not None  # a greedy turn never waits
