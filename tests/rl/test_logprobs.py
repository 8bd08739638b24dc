"""The update's log-probs with the logits a chunk of tokens at a time: the same values and
gradients as the whole [n, T, v] logits, and a gradient that never holds them whole."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import model as model_lib
from morse_jax.rl import logprobs
from morse_jax.rl.shared_prefix import SharedPrefix

CONFIG = llm.LlmConfig("qwen3", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)


def whole(hidden, head, targets, temperature):
  """The formula with every token's logits at once (the oracle)."""
  logp = logprobs.log_softmax(model_lib.head_logits(hidden, head), temperature)
  return (jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0],
          logprobs.entropy(logp))


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [4, 7, 23, 512])  # divides 28, does not, one chunk
def test_head_logprobs_equal_the_whole_logits_in_values_and_gradients(chunk):
  keys = jax.random.split(jax.random.key(0), 3)
  hidden = jax.random.normal(keys[0], (3, 28, 16))
  head = jax.random.normal(keys[1], (50, 16))
  targets = jax.random.randint(keys[2], (3, 28), 0, 50)
  got = logprobs.head_logprobs(hidden, head, targets, 0.7, chunk)
  want = whole(hidden, head, targets, 0.7)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  loss = lambda f: lambda h, w: jnp.sum(f(h, w, targets, 0.7)[0] * 1.3 + f(h, w, targets, 0.7)[1])
  chunked = lambda h, w, t, temp: logprobs.head_logprobs(h, w, t, temp, chunk)
  for a, b in zip(jax.grad(loss(chunked), (0, 1))(hidden, head),
                  jax.grad(loss(whole), (0, 1))(hidden, head)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def params():
  return llm.init_random(CONFIG, jax.random.key(1), norm_jitter=0.1)


def test_token_logprobs_equal_a_full_forward(params):
  tokens = jnp.asarray(np.random.RandomState(0).randint(1, 97, (2, 19)), jnp.int32)
  mask = jnp.asarray([[0] * 3 + [1] * 16, [1] * 19], jnp.int32)  # left padding
  logits, _ = llm.forward(params, CONFIG, tokens, attention_mask=mask)
  want = whole(logits[:, :-1], jnp.eye(97), tokens[:, 1:], 1.0)  # identity head: the logits
  for chunk in (5, 512):
    got = logprobs.token_logprobs(params, CONFIG, None, tokens, mask, 1.0, chunk=chunk)
    np.testing.assert_allclose(got[0][:, 1:], want[0], atol=2e-5)
    np.testing.assert_allclose(got[1][:, 1:], want[1], atol=2e-5)


def test_shared_prefix_log_probs_do_not_depend_on_the_chunk(params):
  """A packed row: a prompt (segment 0) and two suffixes whose first tokens both read the
  prompt's last slot, which a chunk boundary of 3 separates from some of its readers."""
  tokens = np.asarray([[5, 6, 7, 8, 20, 21, 22, 30, 31]], np.int32)
  segments = np.asarray([[0, 0, 0, 0, 1, 1, 1, 2, 2]], np.int32)
  positions = np.asarray([[0, 1, 2, 3, 4, 5, 6, 4, 5]], np.int32)
  prev = np.asarray([[-1, 0, 1, 2, 3, 4, 5, 3, 7]], np.int32)
  # rows: prompt + first suffix (7 tokens), prompt + second suffix (6), read back from the pack
  row = np.asarray([0, 0], np.int32)
  col = np.asarray([[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 7, 8, 8]], np.int32)
  shared = SharedPrefix(tokens=tokens, positions=positions, segments=segments, prev=prev,
                        row=row, col=col, routes=None)
  got = [logprobs.shared_token_logprobs(params, CONFIG, None, shared, 1.0, chunk=c)
         for c in (3, 512)]
  for a, b in zip(*got):
    np.testing.assert_allclose(a, b, atol=2e-5)
  logits, _ = llm.forward(params, CONFIG, tokens[:1, :7])  # the first suffix's row, unpacked
  want = whole(logits[:, :-1], jnp.eye(97), jnp.asarray(tokens[:1, 1:7]), 1.0)[0]
  np.testing.assert_allclose(got[0][0][0, 1:], want[0], atol=2e-5)


def test_a_gradient_never_holds_the_whole_logits():
  """At 2048 tokens and a 4096-word vocabulary one f32 [1, T, v] array is 32 MiB: the whole
  logits cost a gradient more than three of them (measured: 140 MiB of temporaries), 256-token
  chunks less than one in all (29 MiB, a few chunks' logits and the model's own)."""
  config = llm.LlmConfig("qwen3", vocab_size=4096, hidden_size=64, intermediate_size=128,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32)
  params = jax.eval_shape(lambda: llm.init_random(config, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((1, 2048), jnp.int32)

  def temp_bytes(chunk):
    loss = lambda p, t: jnp.sum(logprobs.token_logprobs(p, config, None, t, None, 1.0,
                                                        remat=True, chunk=chunk)[0])
    compiled = jax.jit(jax.grad(loss)).lower(params, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  one_logits = 2048 * 4096 * 4
  whole_logits, chunked = temp_bytes(4096), temp_bytes(256)
  assert whole_logits - chunked > 2.5 * one_logits
  assert chunked < one_logits
