"""The engine's prefix cache (`llm/prefix_cache.py`): a next turn and a group's samples sent one
by one start after the cached pages of what came before, with the tokens and log-probs of an
engine without the cache; routes never share; eviction makes room; new weights clear it."""

import dataclasses

import jax
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, Request, routes_of
from tests.llm.test_engine import ENGINE, adapter, model, prompts_of  # noqa: F401 (fixtures)

CACHED = dataclasses.replace(ENGINE, prefix_cache=True)


def _turns(engine, first, route=None, turns=3):
  """A conversation: each turn's prompt is the last prompt, its reply and 5 new tokens."""
  prompt, out = list(first), []
  for t in range(turns):
    c = engine.submit(Request(prompt, 9, llm.GREEDY, (), route=route)).result()
    out.append(c)
    prompt = prompt + c.tokens.tolist() + prompts_of([5], seed=40 + t)[0]
  return out


def test_next_turns_reuse_their_pages_with_the_same_results(model):
  first = prompts_of([21], seed=30)[0]
  plain, cached = Engine(model, ENGINE), Engine(model, CACHED)
  want, got = _turns(plain, first), _turns(cached, first)
  for a, b in zip(want, got):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  # turn 2's prompt (21 + 9 + 5 = 35 tokens) starts with turn 1's 29 written tokens: 3 pages of
  # 8 found; turn 3's (49 tokens) finds 5 of its 6 full pages (48 tokens, the last one left)
  assert cached.stats["prefix_pages_hit"] == 3 + 5
  assert cached.stats["prefill_tokens"] == plain.stats["prefill_tokens"] - 8 * (3 + 5)
  assert cached.pages.reserved == 0 and cached.kv_usage()["rows"] == 0
  assert cached.pages.used == cached.kv_usage()["pages_cached_only"] == len(cached.prefix)
  cached.prefix.clear()
  assert cached.pages.used == 0 and not (cached.pages.refcount > 0).any()


def test_samples_sent_one_by_one_share_the_prompt(model):
  prompt = prompts_of([26], seed=31)[0]
  sampling = llm.SamplingConfig(temperature=1.0)
  plain, cached = Engine(model, ENGINE), Engine(model, CACHED)
  for j in range(3):
    request = Request(prompt, 6, sampling, (), jax.random.key(j))
    a, b = plain.submit(request).result(), cached.submit(request).result()
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert cached.stats["prefix_pages_hit"] == 2 * 3  # samples 2 and 3: the prompt's 3 full pages


def test_rows_of_other_routes_do_not_share(model, adapter):
  routes = routes_of(adapter)
  first = prompts_of([21], seed=32)[0]
  engine = Engine(model, CACHED, adapter=adapter)
  engine.submit(Request(first, 9, llm.GREEDY, (), route=routes[0])).result()
  engine.submit(Request(first, 9, llm.GREEDY, (), route=routes[1])).result()
  assert engine.stats["prefix_pages_hit"] == 0
  engine.submit(Request(first, 9, llm.GREEDY, (), route=routes[0])).result()
  assert engine.stats["prefix_pages_hit"] == 2
  want = _turns(Engine(model, ENGINE, adapter=adapter), first, routes[2])
  got = _turns(engine, first, routes[2])
  for a, b in zip(want, got):
    np.testing.assert_array_equal(a.tokens, b.tokens)
  engine.set_adapter(adapter)  # new weights: what the cache holds is stale
  assert len(engine.prefix) == 0 and engine.pages.used == 0


def test_the_cache_gives_its_pages_back_when_an_admission_needs_them(model):
  small = dataclasses.replace(CACHED, num_pages=1 + 2 * ENGINE.pages_per_row)  # two rows' worth
  engine = Engine(model, small)
  prompts = prompts_of([40, 33, 37, 45], seed=33)
  for p in prompts:  # each row leaves 5-7 pages in the cache; the pool holds 32
    engine.submit(Request(p, 30, llm.GREEDY, ())).result()
  assert engine.prefix.stats["evicted"] > 0
  reference = Engine(model, ENGINE)
  for p in prompts[::-1]:  # the oldest prompts were evicted, the newest are found
    got = engine.submit(Request(p, 12, llm.GREEDY, ())).result()
    np.testing.assert_array_equal(got.tokens, reference.submit(
        Request(p, 12, llm.GREEDY, ())).result().tokens)
  assert engine.stats["prefix_pages_hit"] > 0


def test_a_bad_prefix_cache_setting_is_refused_by_name():
  with pytest.raises(ValueError, match="EngineConfig.prefix_cache must be a bool, got 'yes'"):
    EngineConfig(prefix_cache="yes")
