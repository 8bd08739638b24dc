"""The sampler: filters, EOS handling, log-probs, per-row rngs, bucketing and compile counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.llm import sampling as sampling_lib
from tests import tiny_models

CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8)


@pytest.fixture(scope="module")
def params():
  return llm.init_random(CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)


@pytest.fixture(scope="module")
def model(params):
  return llm.Model(CONFIG, params)


def settings(max_new_tokens, sampling=llm.SamplingConfig(), **rest):
  return llm.GenerationSettings(max_new_tokens, sampling, **rest)


def prompts_of(lengths, seed=0):
  return [tiny_models.random_tokens(seed + i, (n,)).tolist() for i, n in enumerate(lengths)]


class CompileCounter:
  """Counts XLA backend compilations while active."""

  def __init__(self):
    self.count = 0
    self.active = False
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, name, duration, **kwargs):
    if self.active and name == "/jax/core/compile/backend_compile_duration":
      self.count += 1

  def __enter__(self):
    self.count, self.active = 0, True
    return self

  def __exit__(self, *exc):
    self.active = False


def test_bucket():
  assert [llm.bucket(n) for n in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, 128]
  assert llm.bucket(3, minimum=1) == 4
  # 2^k or 3 * 2^(k-1): the smallest that holds n, never below the minimum.
  got = [llm.length_bucket(n) for n in (1, 16, 17, 25, 33, 405, 581, 771, 1025)]
  assert got == [16, 16, 24, 32, 48, 512, 768, 1024, 1536]
  assert llm.length_bucket(5, minimum=1) == 6 and llm.length_bucket(2, minimum=1) == 2


def test_similar_sizes_do_not_recompile(model):
  sampling = llm.SamplingConfig(temperature=0.8, top_p=0.9, top_k=20)
  llm.sample(model, prompts_of([5, 9, 20]), settings(10, sampling), rng=jax.random.key(0))
  with CompileCounter() as counter:  # 4 rows, prompt <= 24, new <= 16: the same buckets
    llm.sample(model, prompts_of([17, 3, 23, 8], seed=5), settings(13, sampling),
               rng=jax.random.key(1))
  assert counter.count == 0
  with CompileCounter() as counter:  # a longer prompt bucket must compile: the counter works
    llm.sample(model, prompts_of([40]), settings(13, sampling), rng=jax.random.key(1))
  assert counter.count >= 1


def test_logprobs_are_model_log_softmax_at_temperature_one(params, model):
  """With no filter, each recorded log-prob equals log_softmax of a full forward pass."""
  prompts = prompts_of([6, 11])
  out = llm.sample(model, prompts, settings(8, llm.SamplingConfig(temperature=1.0)),
                   rng=jax.random.key(3))
  for row, prompt in enumerate(prompts):
    seq = np.asarray(prompt + out.tokens[row].tolist())[None]
    logits, _ = llm.forward(params, CONFIG, jnp.asarray(seq))
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    positions = np.arange(len(prompt) - 1, seq.shape[1] - 1)
    expected = np.asarray(logp)[positions, out.tokens[row]]
    np.testing.assert_allclose(out.logprobs[row], expected, atol=2e-5)


def test_temperature_scales_logprobs(params, model):
  prompts = prompts_of([7])
  out = llm.sample(model, prompts, settings(4, llm.SamplingConfig(temperature=0.5)),
                   rng=jax.random.key(4))
  seq = np.asarray(prompts[0] + out.tokens[0].tolist())[None]
  logits, _ = llm.forward(params, CONFIG, jnp.asarray(seq))
  logp = np.asarray(jax.nn.log_softmax(logits[0] / 0.5, axis=-1))
  positions = np.arange(len(prompts[0]) - 1, seq.shape[1] - 1)
  np.testing.assert_allclose(out.logprobs[0], logp[positions, out.tokens[0]], atol=2e-5)


def test_top_k_one_and_tiny_top_p_are_greedy(model):
  prompts = prompts_of([5, 12, 3])
  rng = jax.random.key(5)
  greedy = llm.sample(model, prompts, settings(12, llm.GREEDY), rng=rng)
  top1 = llm.sample(model, prompts, settings(12, llm.SamplingConfig(1.0, top_k=1)), rng=rng)
  top_p = llm.sample(model, prompts, settings(12, llm.SamplingConfig(1.0, top_p=1e-6)), rng=rng)
  np.testing.assert_array_equal(top1.tokens, greedy.tokens)
  np.testing.assert_array_equal(top_p.tokens, greedy.tokens)
  np.testing.assert_allclose(top1.logprobs, 0.0, atol=1e-6)  # a one-token distribution


def test_filter_keeps_the_right_sets():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  top_p = np.asarray(sampling_lib._filter_logits(logits, llm.SamplingConfig(1.0, top_p=0.8)))
  assert np.isfinite(top_p).tolist() == [[True, True, False, False]]
  top_p = np.asarray(sampling_lib._filter_logits(logits, llm.SamplingConfig(1.0, top_p=0.81)))
  assert np.isfinite(top_p).tolist() == [[True, True, True, False]]
  top_k = np.asarray(sampling_lib._filter_logits(logits, llm.SamplingConfig(1.0, top_k=3)))
  assert np.isfinite(top_k).tolist() == [[True, True, True, False]]


def test_sampling_frequencies_follow_filtered_distribution():
  """Many draws from the filtered distribution match its probabilities."""
  probs = np.asarray([0.5, 0.3, 0.15, 0.05])
  logits = jnp.tile(jnp.log(jnp.asarray(probs))[None], (4000, 1))
  keys = jax.random.split(jax.random.key(0), 4000)
  tokens, logp = sampling_lib._choose(logits, keys, 0, llm.SamplingConfig(1.0, top_p=0.8))
  freq = np.bincount(np.asarray(tokens), minlength=4) / 4000
  np.testing.assert_allclose(freq, [0.625, 0.375, 0, 0], atol=0.03)
  np.testing.assert_allclose(np.exp(np.asarray(logp))[np.asarray(tokens) == 0], 0.625, atol=1e-5)


def test_eos_stops_rows_and_pads(model):
  prompts = prompts_of([4, 8, 6])
  free = llm.sample(model, prompts, settings(16, llm.GREEDY), rng=jax.random.key(6))
  eos = (int(free.tokens[0, 2]), int(free.tokens[1, 5]))
  out = llm.sample(model, prompts, settings(16, llm.GREEDY, eos_ids=eos, pad_id=0),
                   rng=jax.random.key(6))
  for row in range(3):
    hits = [i for i, t in enumerate(free.tokens[row]) if t in eos]
    expected_len = hits[0] + 1 if hits else 16
    assert out.lengths[row] == expected_len
    np.testing.assert_array_equal(out.tokens[row, :expected_len], free.tokens[row, :expected_len])
    assert (out.tokens[row, expected_len:] == 0).all()
    assert (out.logprobs[row, expected_len:] == 0).all()


def test_rows_do_not_depend_on_their_neighbours(model):
  """A row's tokens depend on its prompt and its index's key, not on batch size or padding."""
  prompts = prompts_of([3, 10, 25])
  ten = settings(10, llm.SamplingConfig(temperature=1.0, top_p=0.95))
  batch = llm.sample(model, prompts, ten, rng=jax.random.key(7))
  first = llm.sample(model, prompts[:1], ten, rng=jax.random.key(7))
  np.testing.assert_array_equal(batch.tokens[0], first.tokens[0])
  np.testing.assert_allclose(batch.logprobs[0], first.logprobs[0], atol=1e-5)
  other = llm.sample(model, prompts, ten, rng=jax.random.key(8))
  assert not np.array_equal(other.tokens, batch.tokens)


def test_a_row_with_its_own_key_draws_the_same_anywhere(model):
  """row_keys: a row keeps its key wherever it sits and whatever the batch; rows given
  fold_in(rng, i) draw what they draw without row_keys."""
  prompts = prompts_of([3, 10, 25])
  ten = settings(10, llm.SamplingConfig(temperature=1.0))
  rng, own = jax.random.key(7), jax.random.key(99)
  plain = llm.sample(model, prompts, ten, rng=rng)
  same = jnp.stack([jax.random.fold_in(rng, i) for i in range(3)])
  again = llm.sample(model, prompts, ten, rng=rng, row_keys=same)
  np.testing.assert_array_equal(again.tokens, plain.tokens)
  moved = llm.sample(model, [prompts[1], prompts[2], prompts[0]], ten, rng=jax.random.key(8),
                     row_keys=jnp.stack([same[1], own, same[0]]))
  alone = llm.sample(model, prompts[:1], ten, rng=jax.random.key(9), row_keys=same[:1])
  np.testing.assert_array_equal(moved.tokens[2], plain.tokens[0])
  np.testing.assert_array_equal(moved.tokens[0], plain.tokens[1])
  np.testing.assert_array_equal(alone.tokens[0], plain.tokens[0])
  with pytest.raises(ValueError, match="row_keys must be \\(3,\\) keys"):
    llm.sample(model, prompts, settings(2), rng=rng, row_keys=same[:2])


def test_bad_arguments_name_the_field(model):
  with pytest.raises(ValueError, match="temperature"):
    llm.SamplingConfig(temperature=-1)
  with pytest.raises(ValueError, match="top_p"):
    llm.SamplingConfig(top_p=0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    llm.sample(model, [[1]], settings(0), rng=jax.random.key(0))
  with pytest.raises(ValueError, match="outside the vocabulary"):
    llm.sample(model, [[1, 500]], settings(2), rng=jax.random.key(0))
  with pytest.raises(ValueError, match="at least one token"):
    llm.sample(model, [[]], settings(2), rng=jax.random.key(0))


def test_unstacked_decode_equals_scanned_decode(model):
  """The fused CPU decode loop (`llm.fused_decode`) and the scan agree."""
  prompts = prompts_of([4, 9])
  rng, sampling = jax.random.key(9), llm.SamplingConfig(0.9)
  scanned = llm.sample(model, prompts, settings(10, sampling, unstack=False), rng=rng)
  unrolled = llm.sample(model, prompts, settings(10, sampling, unstack=True), rng=rng)
  np.testing.assert_array_equal(scanned.tokens, unrolled.tokens)
  np.testing.assert_allclose(scanned.logprobs, unrolled.logprobs, atol=1e-5)


def sorted_top_p_keep(probs, top_p):
  """The textbook nucleus set: sort descending, keep while the mass before a token is < top_p."""
  keep = np.zeros_like(probs, bool)
  for row, p in enumerate(probs):
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    kept = order[before < top_p]
    keep[row, p >= p[kept].min()] = True  # ties with the last kept token stay too
  return keep


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_bisection_equals_sorted_nucleus(top_p):
  logits = jax.random.normal(jax.random.key(11), (32, 500)) * 3.0
  probs = jax.nn.softmax(logits, axis=-1)
  keep = np.asarray(probs >= sampling_lib.top_p_threshold(probs, top_p))
  np.testing.assert_array_equal(keep, sorted_top_p_keep(np.asarray(probs, np.float64), top_p))


def test_inverse_cdf_skips_zero_probability_entries():
  probs = jnp.asarray([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]] * 2)
  uniform = jnp.asarray([0.0, 0.0, 0.999999, 0.5])
  np.testing.assert_array_equal(np.asarray(sampling_lib.inverse_cdf(probs, uniform)),
                                [1, 2, 3, 2])


def test_padding_rows_do_not_keep_the_loop_running(params, model):
  """3 prompts bucket to 4 rows; once the 3 real rows hit EOS the loop stops (all lengths short)."""
  prompts = prompts_of([4, 8, 6])
  free = llm.sample(model, prompts, settings(16, llm.GREEDY), rng=jax.random.key(6))
  eos = tuple(int(t) for t in free.tokens[:, 0])  # every real row stops at its first token
  tokens, mask = sampling_lib.left_pad(prompts, 16, 4, 0)
  keys = jax.random.split(jax.random.key(0), 4)
  active = jnp.asarray([True, True, True, False])
  _, _, lengths = sampling_lib.generate_padded(
      params, CONFIG, jnp.asarray(tokens), jnp.asarray(mask), keys, jnp.int32(16),
      settings(16, llm.GREEDY, eos_ids=eos), active=active)
  np.testing.assert_array_equal(np.asarray(lengths), [1, 1, 1, 0])


def test_repeated_prompts_are_prefilled_once_with_the_same_samples(model):
  """prompt_repeats=r: one prefill per run of r equal prompts, its cache repeated; each row
  still draws its own tokens (rows of a run differ) exactly as without sharing."""
  prompts = [p for p in prompts_of([5, 9]) for _ in range(3)]
  sampling, rng = llm.SamplingConfig(temperature=1.0), jax.random.key(3)
  ref = llm.sample(model, prompts, settings(8, sampling), rng=rng)
  threes = settings(8, sampling, prompt_repeats=3)
  got = llm.sample(model, prompts, threes, rng=rng)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
  assert not np.array_equal(got.tokens[0], got.tokens[1])
  with pytest.raises(ValueError, match="row 4 differs from row 3 of its run \\(prompt\\)"):
    llm.sample(model, prompts[:4] + [[1, 2]] + prompts[5:], threes, rng=rng)
  with pytest.raises(ValueError, match="prompt_repeats=4 must be an int >= 1 dividing the 6"):
    llm.sample(model, prompts, settings(8, sampling, prompt_repeats=4), rng=rng)


@pytest.mark.parametrize("chunk", [16, 20])  # 20: the largest power of two dividing 48 is used
def test_chunked_prefill_equals_one_pass(params, chunk):
  """A long prompt prefilled in chunks (bounded attention memory) gives the one pass's logits
  and cache, left padding included."""
  prompts = prompts_of([45, 30, 7])
  tokens, mask = sampling_lib.left_pad(prompts, 48, 3, 0)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  cache = llm.init_cache(CONFIG, 3, 64)
  whole, whole_cache = sampling_lib.prefill(params, CONFIG, tokens, mask, cache, chunk=512)
  parts, parts_cache = sampling_lib.prefill(params, CONFIG, tokens, mask, cache, chunk=chunk)
  np.testing.assert_allclose(parts, whole, atol=2e-5, rtol=1e-5)
  valid = np.asarray(whole_cache.valid)
  np.testing.assert_array_equal(np.asarray(parts_cache.valid), valid)
  for a, b in ((parts_cache.k, whole_cache.k), (parts_cache.v, whole_cache.v)):
    a, b = np.asarray(a), np.asarray(b)  # [l, b, k, s, x]; padding slots are never read
    np.testing.assert_allclose(a.transpose(1, 3, 0, 2, 4)[valid], b.transpose(1, 3, 0, 2, 4)[valid],
                               atol=2e-5, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(parts_cache.next_pos), [45, 30, 7])
  assert int(parts_cache.length) == 48


def test_bfloat16_weights_sample_on_cpu():
  """bf16 weights: prefill attention runs in f32 on XLA:CPU (it has no batched bf16 x bf16 ->
  f32 dot; sampling raised UNIMPLEMENTED before); the first greedy token is the bf16 forward's
  argmax, and bf16 logits stay within 5% of the f32 model's range."""
  params32 = llm.init_random(CONFIG, jax.random.key(0), scale=0.3)
  params16 = llm.params.cast(params32, jnp.bfloat16)
  prompts = prompts_of([5, 5])
  out16 = llm.sample(llm.Model(CONFIG, params16), prompts, settings(6, llm.GREEDY),
                     rng=jax.random.key(0))
  tokens = jnp.asarray(prompts)
  logits16 = np.asarray(llm.forward(params16, CONFIG, tokens)[0], np.float32)
  logits32 = np.asarray(llm.forward(params32, CONFIG, tokens)[0])
  np.testing.assert_array_equal(out16.tokens[:, 0], logits16[:, -1].argmax(-1))
  assert np.abs(logits16 - logits32).max() < 0.05 * np.abs(logits32).max()
