"""`InProcessChat.generate` on the engine: each row's completion equal to the static sampler's
(`engine=False`, today's merged `llm.sample` call) for greedy and seeded sampled rows, with
ragged token limits, stop ids and stop strings, rows with keys of their own, and an adapter
route; the engine kept across calls and rebuilt larger only when a batch outgrows it; a mesh of
several devices keeps the static call; a refused row leaves no request behind."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from apex_jax.judges import InProcessChat
from apex_jax.judges.chat import JudgeRequestError, JudgeResponseError
from apex_jax.judges.inprocess import seeded_keys
from morse_jax import llm
from tests.apex.agents import fakes
from tests.apex.judges.test_server import random_route

STOP = 33  # a token the random model emits now and then: some rows end before their limit
LIMITS = [12, 3, 9, 1, 7]


@pytest.fixture(scope="module")
def model():
  config = llm.LlmConfig("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True,
                         max_position_embeddings=256)
  params = llm.init_random(config, jax.random.PRNGKey(0), scale=0.3, norm_jitter=0.2)
  return llm.Model(config, params, fakes.tokenizer(), stop_ids=(fakes.EOS, STOP))


def prompts_of(chat, rows=5):
  return [chat.prompt_tokens([{"role": "user", "content": " ".join(
      f"w{j}" for j in range(i, i + 2 + 3 * i))}]) for i in range(rows)]


def both(model, route=None, **kwargs):
  """(the engine's completions, the static sampler's) of one call on two equal chats."""
  engine, static = (InProcessChat(model, route, seed=3, engine=e) for e in (True, False))
  prompts = prompts_of(engine)
  got = engine.generate(prompts, LIMITS, **kwargs)
  assert engine._engine is not None and static._engine is None
  return got, static.generate(prompts, LIMITS, **kwargs)


def test_greedy_rows_with_limits_stop_ids_and_stop_strings_equal_the_static_call(model):
  stops = [["w27"], [], ["w60", "w5"], [], ["zzz"]]
  got, want = both(model, temperature=0.0, stops=stops)
  assert got == want
  assert [c.token_ids for c in got] == [c.token_ids for c in want]  # Completion skips them
  assert [c.completion_tokens for c in got] == [min(n, len(c.token_ids)) for n, c in
                                                zip(LIMITS, got)]
  assert any(c.token_ids[-1] == STOP and c.completion_tokens < n for c, n in zip(got, LIMITS))
  assert any(c.finish_reason == "stop" and c.token_ids[-1] != STOP for c in got)  # a string
  assert any(c.finish_reason == "length" for c in got)


def test_seeded_sampled_rows_and_rows_with_own_keys_equal_the_static_call(model):
  keys = [None, *seeded_keys(11, 0, 2), None, None]
  got, want = both(model, temperature=1.0, top_p=0.9, keys=keys)
  assert [c.token_ids for c in got] == [c.token_ids for c in want]
  greedy, _ = both(model, temperature=0.0)
  assert [c.token_ids for c in got] != [c.token_ids for c in greedy]  # it did sample


@pytest.mark.slow
def test_adapter_route_rows_equal_the_static_call(model):
  got, want = both(model, random_route(model), temperature=0.0)
  assert [c.token_ids for c in got] == [c.token_ids for c in want]
  bare, _ = both(model, temperature=0.0)
  assert [c.token_ids for c in got] != [c.token_ids for c in bare]  # the route matters


def test_one_engine_for_the_chat_rebuilt_only_when_a_batch_outgrows_it(model):
  chat = InProcessChat(model, seed=3)
  prompts = prompts_of(chat)
  chat.generate(prompts[:2], [4, 4], temperature=0.0)
  first = chat._engine[0]
  assert (first.config.slots, first.config.max_len) == (2, 16)
  chat.generate(prompts[1:3], [2, 3], temperature=0.0)
  assert chat._engine[0] is first
  chat.generate(prompts, LIMITS, temperature=0.0)
  bigger = chat._engine[0]
  assert bigger is not first and (bigger.config.slots, bigger.config.max_len) == (8, 32)
  chat.generate(prompts[:1], [2], temperature=0.0)
  assert chat._engine[0] is bigger and bigger.pages.used == 0 and not bigger.busy
  # New params (the chat's model replaced): a new engine that generates with them.
  other = dataclasses.replace(model, params=llm.init_random(
      model.config, jax.random.PRNGKey(1), scale=0.3, norm_jitter=0.2))
  chat.model = other
  got = chat.generate(prompts, LIMITS, temperature=0.0)
  assert chat._engine[0] is not bigger
  oracle = lambda m: [c.token_ids for c in InProcessChat(m, engine=False).generate(
      prompts, LIMITS, temperature=0.0)]
  assert [c.token_ids for c in got] == oracle(other) != oracle(model)


def test_a_mesh_of_several_devices_keeps_the_static_call(model, monkeypatch):
  class Mesh:  # what generate reads of a mesh
    size = 2

  calls = []

  def sample(model, prompts, settings, **kwargs):
    calls.append(kwargs["mesh"])
    return llm.SampleOutput(tokens=np.full((1, 2), 7), logprobs=None, lengths=np.asarray([2]))

  monkeypatch.setattr(llm, "sample", sample)
  chat = InProcessChat(model, mesh=Mesh())
  out = chat.generate(prompts_of(chat, 1), [2], temperature=0.0)
  assert calls == [chat.mesh] and chat._engine is None and out[0].completion_tokens == 2


def test_a_refused_row_leaves_nothing_queued_for_the_next_call(model):
  chat = InProcessChat(model, seed=3, max_context=32)
  prompts = prompts_of(chat)
  with pytest.raises(ValueError, match="max_new_tokens 20 is 34 tokens, more than the engine's "
                                       "capacity of 32"):
    chat.generate([prompts[0], prompts[3]], [2, 20], temperature=0.0)
  assert chat._engine is None
  got = chat.generate(prompts[:2], [4, 4], temperature=0.0)
  want = InProcessChat(model, seed=3, engine=False)
  want._calls = iter(range(1, 9))  # the refused call took the chat's first key
  assert [c.token_ids for c in got] == [c.token_ids for c in want.generate(
      prompts[:2], [4, 4], temperature=0.0)]


def test_broken_weights_are_counted_judge_failures_not_a_crash(model):
  """Non-finite log-probs (NaN weights) fail the engine's rows: `complete_many` answers each
  conversation with a JudgeResponseError (the judges count it), a bad one still with its own."""
  broken = dataclasses.replace(model, params=jax.tree.map(lambda x: x * float("nan"),
                                                           model.params))
  chat = InProcessChat(broken, max_context=32)
  out = chat.complete_many([[{"role": "user", "content": "w1 w2"}], [{"role": "robot"}],
                            [{"role": "user", "content": "w3"}]], max_tokens=4, temperature=0.0)
  assert isinstance(out[0], JudgeResponseError) and "non-finite" in str(out[0])
  assert isinstance(out[1], JudgeRequestError) and isinstance(out[2], JudgeResponseError)
