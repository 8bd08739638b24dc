"""`toy.evaluate`'s greedy calls (reading, distiller, MoRSE metrics) on the engine: the static
sampler's output (tokens, lengths, pad after the end) on ragged prompts whose rows end at a
stop id at different steps."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from apex_jax.toy.evaluate import greedy_replies
from morse_jax import llm
from tests import tiny_models

STOP = 38  # emitted now and then by this random model: rows end early, at different steps


@pytest.mark.slow  # ~13 s: the engine's and the static sampler's programs on the toy's prompts
def test_greedy_replies_equal_the_static_sampler():
  config = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         max_position_embeddings=256)
  params = llm.init_random(config, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  model = llm.Model(config, params, stop_ids=(STOP,))
  prompts = [tiny_models.random_tokens(i, (n,)).tolist() for i, n in enumerate([5, 30, 9, 17, 3])]
  got = greedy_replies(model, prompts, 24)
  want = llm.sample(model, prompts, llm.GenerationSettings.for_model(model, 24, llm.GREEDY),
                    rng=jax.random.key(0))
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert 1 < len(set(got.lengths.tolist())) and got.lengths.min() < 24  # ragged, some stopped
