"""The generation engine: the static sampler's tokens on ragged requests, log-probs of a full
forward, per-request rngs, pages (freed, shared, bounded), refusals, failures kept to their rows.

One engine shape throughout (4 slots, pages of 8, chunks of 16, 4 tokens per call), so the
programs compile once per row bucket for the whole module."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.llm.engine import Engine, EngineConfig, EngineError, Request, routes_of
from tests import tiny_models

CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
ENGINE = EngineConfig(slots=4, max_len=128, page_size=8, prefill_chunk=16, steps_per_call=4)
STOP = 38  # a token the random model emits now and then: some rows stop before their budget
LORA = lora.LoraConfig(targets=("q", "v", "o"), last_n_layers=1, rank=4, alpha=8.0,
                       num_subtask_experts=3)
LENGTHS = [5, 30, 9, 17, 3, 40, 12, 25, 7, 33]  # ragged prompts, more requests than slots
BUDGETS = [20, 3, 12, 1, 30, 8, 16, 5, 24, 10]


@pytest.fixture(scope="module")
def model():
  params = llm.init_random(CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  return llm.Model(CONFIG, params, stop_ids=(STOP,))


@pytest.fixture(scope="module")
def adapter(model):
  experts = lora.init_experts(LORA, CONFIG, jax.random.key(3))
  keys = iter(jax.random.split(jax.random.key(4), 8))
  experts = {t: lora.ExpertWeights(a=e.a * 10, b=0.2 * jax.random.normal(next(keys), e.b.shape))
             for t, e in experts.items()}
  sets = [[0, 2], [1], [0, 3, 4], [1, 2]] * 3
  return lora.make_adapter(experts, LORA, CONFIG, sets[:len(LENGTHS)], kernel="dense")


def prompts_of(lengths, seed=0):
  return [tiny_models.random_tokens(seed + i, (n,)).tolist() for i, n in enumerate(lengths)]


def settings(max_new, sampling=llm.GREEDY):
  return llm.GenerationSettings(max_new, sampling, eos_ids=(STOP,))


def run_requests(engine, requests):
  handles = [engine.submit(r) for r in requests]
  engine.run()
  return [h.result() for h in handles]


def assert_equals_sample(model, completions, prompts, budgets, reference):
  """Each completion is the sampler's row cut at the request's own budget."""
  stopped = 0
  for i, c in enumerate(completions):
    n = min(budgets[i], int(reference.lengths[i]))
    np.testing.assert_array_equal(c.tokens, reference.tokens[i, :n], err_msg=f"row {i}")
    # Each side is within 1e-5 of a full forward (test_logprobs_equal_a_full_forward; on this
    # random model the engine's CPU attention kernel 7.6e-6, the sampler 6.2e-6), so the two
    # can be 2e-5 apart (1.4e-5 seen: the kernel's summation order is not the sampler's).
    np.testing.assert_allclose(c.logprobs, reference.logprobs[i, :n], atol=2e-5)
    stopped += c.finish_reason == "stop"
    assert c.finish_reason == ("stop" if c.tokens[-1] == STOP else "length")
  assert stopped  # the stop path is exercised


@pytest.mark.slow
@pytest.mark.parametrize("with_adapter", [False, True], ids=["bare", "adapter"])
def test_greedy_ragged_requests_equal_the_static_sampler(model, adapter, with_adapter):
  prompts = prompts_of(LENGTHS)
  chosen = adapter if with_adapter else None
  reference = llm.sample(model, prompts, settings(max(BUDGETS)), rng=jax.random.key(0),
                         adapter=chosen)
  engine = Engine(model, ENGINE, adapter=chosen)
  routes = routes_of(adapter) if with_adapter else [None] * len(prompts)
  completions = run_requests(engine, [
      Request(p, b, llm.GREEDY, route=r) for p, b, r in zip(prompts, BUDGETS, routes)])
  assert_equals_sample(model, completions, prompts, BUDGETS, reference)
  assert engine.pages.used == 0 and engine.pages.reserved == 0  # every page back
  assert engine.stats["prefill_calls"] > 2  # chunked: the 40-token prompt took 3 chunks
  if with_adapter:
    bare = llm.sample(model, prompts, settings(max(BUDGETS)), rng=jax.random.key(0))
    assert not np.array_equal(bare.tokens, reference.tokens)  # the routes matter


def test_decode_programs_per_multiple_of_a_row_step(model):
  """decode_row_step: programs of 3 or 4 rows (not a power of two), the same greedy tokens."""
  prompts = prompts_of(LENGTHS)
  requests = lambda: [Request(p, b, llm.GREEDY) for p, b in zip(prompts, BUDGETS)]
  stepped = Engine(model, dataclasses.replace(ENGINE, min_decode_rows=1, decode_row_step=3))
  assert [stepped._decode_rows(n) for n in (1, 2, 3, 4)] == [1, 3, 3, 4]
  wide = Engine(model, EngineConfig(slots=32, max_len=128, decode_row_step=4))
  assert [wide._decode_rows(n) for n in (1, 4, 5, 17, 29, 32)] == [4, 4, 8, 20, 32, 32]
  got = [c.tokens.tolist() for c in run_requests(stepped, requests())]
  assert got == [c.tokens.tolist() for c in run_requests(Engine(model, ENGINE), requests())]
  with pytest.raises(ValueError, match="EngineConfig.decode_row_step must be an int >= 0"):
    EngineConfig(decode_row_step=-1)


def test_longest_budget_prefilled_first_same_tokens(model):
  """prefill_order "longest": the largest budget's row starts decoding first (one prefill row
  per step), and every request gets the tokens it gets in arrival order."""
  prompts = prompts_of([6, 6, 6, 6])
  budgets = [4, 8, 30, 12]
  requests = lambda: [Request(p, b, llm.GREEDY, stop_ids=()) for p, b in zip(prompts, budgets)]
  config = dataclasses.replace(ENGINE, prefill_rows=1)
  longest = Engine(model, dataclasses.replace(config, prefill_order="longest"))
  handles = [longest.submit(r) for r in requests()]
  longest.step()
  assert [len(h.tokens) for h in handles] == [0, 0, 4, 0]  # the 30-token row only
  longest.step()
  assert [len(h.tokens) for h in handles] == [0, 0, 8, 4]  # then the 12-token one
  longest.run()
  arrival = run_requests(Engine(model, config), requests())
  assert [h.result().tokens.tolist() for h in handles] == [c.tokens.tolist() for c in arrival]
  with pytest.raises(ValueError, match="EngineConfig.prefill_order must be one of"):
    EngineConfig(prefill_order="shortest")


def test_logprobs_equal_a_full_forward(model):
  prompts = prompts_of([6, 19, 11], seed=7)
  sampling = llm.SamplingConfig(temperature=1.0)
  out = Engine(model, ENGINE).generate(prompts, settings(12, sampling), rng=jax.random.key(5))
  for i, prompt in enumerate(prompts):
    reply = out.tokens[i, :out.lengths[i]].tolist()
    logits, _ = llm.forward(model.params, CONFIG, jnp.asarray([prompt + reply]))
    logp = jax.nn.log_softmax(logits[0, len(prompt) - 1:-1], axis=-1)
    want = np.asarray(jnp.take_along_axis(logp, jnp.asarray(reply)[:, None], axis=-1)[:, 0])
    np.testing.assert_allclose(out.logprobs[i, :len(reply)], want, atol=1e-5)


def test_seeded_samples_do_not_depend_on_arrival_order_or_slot(model):
  prompts = prompts_of(LENGTHS[:6], seed=3)
  samplings = [llm.SamplingConfig(temperature=0.9, top_p=0.8),
               llm.SamplingConfig(temperature=1.2, top_k=7), llm.GREEDY,
               llm.SamplingConfig(temperature=0.7, top_p=0.9, top_k=20)]
  requests = [Request(p, 10, samplings[i % 4], (STOP,), jax.random.key(100 + i))
              for i, p in enumerate(prompts)]
  forward = run_requests(Engine(model, ENGINE), requests)
  backward = run_requests(Engine(model, ENGINE), requests[::-1])[::-1]
  for a, b in zip(forward, backward):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
  # The same draws as the static sampler's rows with the same keys and settings.
  for i, request in enumerate(requests[:2]):
    want = llm.sample(model, [request.prompt], settings(10, request.sampling),
                      rng=jax.random.key(0), row_keys=jnp.stack([request.rng]))
    np.testing.assert_array_equal(forward[i].tokens, want.tokens[0, :want.lengths[0]])


def test_group_shares_its_prompt_pages(model):
  """Three samples of a 20-token prompt (pages of 8): two full pages held once with refcount
  3, the third page copied per member; members draw as single requests with fold_in(rng, j);
  KV held stays within 1.25 x tokens live + one page per row; every page back at the end."""
  engine = Engine(model, ENGINE)
  prompt = prompts_of([20], seed=11)[0]
  sampling = llm.SamplingConfig(temperature=1.0)
  rng = jax.random.key(9)
  group = engine.submit_group(Request(prompt, 24, sampling, (), rng), 3)
  other = engine.submit(Request(prompts_of([37], seed=12)[0], 24, sampling, (), rng))
  engine.step()
  engine.step()  # the group's prompt (two chunks) is in; the members forked
  shared = [p for p in range(engine.pages.num_pages) if engine.pages.refcount[p] == 3]
  assert len(shared) == 2
  for _ in range(3):
    engine.step()
    usage = engine.kv_usage()
    assert usage["slots_held"] <= 1.25 * usage["tokens_live"] + 8 * usage["rows"], usage
  engine.run()
  assert engine.pages.used == 0 and engine.pages.reserved == 0
  assert not (engine.pages.refcount > 0).any()
  singles = run_requests(Engine(model, ENGINE), [
      Request(prompt, 24, sampling, (), jax.random.fold_in(rng, j)) for j in range(3)])
  for handle, single in zip(group, singles):
    np.testing.assert_array_equal(handle.result().tokens, single.tokens)
  assert len({tuple(h.result().tokens) for h in group}) > 1  # different keys, different samples
  assert other.result().finish_reason == "length"


def test_streaming_and_cancel(model):
  engine = Engine(model, ENGINE)
  prompts = prompts_of([9, 14], seed=20)
  streamed = engine.submit(Request(prompts[0], 13, llm.GREEDY, ()))
  cancelled = engine.submit(Request(prompts[1], 100, llm.GREEDY, ()))
  seen = []
  for token in streamed.stream():
    seen.append(token)
    if len(seen) == 5:
      cancelled.cancel()
  assert seen == streamed.result().tokens.tolist() and len(seen) == 13
  engine.run()
  assert cancelled.finish_reason == "cancelled" and len(cancelled.tokens) < 100
  assert engine.pages.used == 0 and all(s is None for s in engine.slots)


def test_a_failing_row_fails_alone(model, adapter):
  """A route with NaN weights poisons only its own row: that request fails, naming why; the
  others equal the sampler."""
  prompts = prompts_of(LENGTHS[:5])
  routes = routes_of(adapter)[:5]
  routes[2] = lora.Routes(idx=routes[2].idx, w=np.full_like(routes[2].w, np.nan))
  engine = Engine(model, ENGINE, adapter=adapter)
  handles = [engine.submit(Request(p, 8, llm.GREEDY, (STOP,), route=r))
             for p, r in zip(prompts, routes)]
  engine.run()
  with pytest.raises(EngineError, match="non-finite log-prob"):
    handles[2].result()
  reference = llm.sample(model, prompts, settings(8), rng=jax.random.key(0),
                         adapter=adapter.map_rows(lambda a: a[:5]))
  for i in (0, 1, 3, 4):
    n = int(reference.lengths[i])
    np.testing.assert_array_equal(handles[i].result().tokens, reference.tokens[i, :n])
  assert engine.pages.used == 0


@pytest.mark.parametrize("change, message", [
    (dict(prompt=[]), "Request.prompt must be a non-empty"),
    (dict(prompt=[1, 96]), "token id 96 is outside the vocabulary"),
    (dict(prompt=[1] * 100, max_new_tokens=29),
     "a prompt of 100 tokens plus max_new_tokens 29 is 129 tokens, more than the engine's "
     "capacity of 128"),
    (dict(max_new_tokens=0), "Request.max_new_tokens must be an int >= 1, got 0"),
    (dict(max_new_tokens=-3), "Request.max_new_tokens must be an int >= 1, got -3"),
    (dict(stop_ids=[3, 200]), "Request.stop_ids: 200 is outside the vocabulary"),
    (dict(stop_ids=[-1]), "Request.stop_ids: -1 is outside the vocabulary"),
    (dict(route=np.zeros(2)), "Request.route is given but the engine has no adapter"),
])
def test_bad_requests_are_refused_by_name(model, change, message):
  engine = Engine(model, ENGINE)
  request = Request(**{**dict(prompt=[1, 2, 3], max_new_tokens=4), **change})
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    engine.submit(request)
  assert not engine.waiting


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
    ("top_k", -1, "top_k must be .*>= 0, got -1"),
])
def test_bad_sampling_settings_are_refused_by_name(model, field, value, message):
  with pytest.raises(ValueError, match=message):  # SamplingConfig refuses when built
    llm.SamplingConfig(**{field: value})
  sampling = llm.SamplingConfig()
  object.__setattr__(sampling, field, value)  # one built around its own checks
  with pytest.raises(ValueError, match=f"Request.sampling.{message}"):
    Engine(model, ENGINE).submit(Request([1, 2], 4, sampling))


def test_bad_engine_settings_and_groups_are_refused_by_name(model, adapter):
  with pytest.raises(ValueError, match="EngineConfig.max_len 512 is more than the model's "
                     r"max_position_embeddings \(256\)"):
    Engine(model, EngineConfig(max_len=512))
  with pytest.raises(ValueError, match="EngineConfig.prefill_chunk must be a power of two"):
    EngineConfig(prefill_chunk=24)
  with pytest.raises(ValueError, match="EngineConfig.min_decode_rows must be a power of two"):
    EngineConfig(min_decode_rows=3)
  with pytest.raises(ValueError, match=r"submit_group: n must be an int in \[1, 4\]"):
    Engine(model, ENGINE).submit_group(Request([1, 2], 4), 5)
  with pytest.raises(ValueError, match="Request.route is None but the engine runs an adapter"):
    Engine(model, ENGINE, adapter=adapter).submit(Request([1, 2], 4))
  with pytest.raises(ValueError, match="Request.route: leaves"):
    Engine(model, ENGINE, adapter=adapter).submit(
        Request([1, 2], 4, route=lora.Routes(idx=np.zeros(5, np.int32), w=np.zeros(5))))


def test_set_adapter_between_requests_only(model, adapter):
  """A trainer's new weights go in between requests (same routes); refused while rows run."""
  engine = Engine(model, ENGINE, adapter=adapter)
  with pytest.raises(ValueError, match="takes none"):
    engine.set_adapter(None)
  [route] = routes_of(adapter)[:1]
  engine.submit(Request([1, 2], 4, route=route))
  with pytest.raises(RuntimeError, match="requests are waiting or live"):
    engine.set_adapter(adapter)
  engine.run()
  engine.set_adapter(dataclasses.replace(adapter, kernel="merged"))
  assert engine.adapter.kernel == "auto"  # the per-row kernel: "merged" holds one route


def test_a_bfloat16_pool_is_written_as_its_bits_in_place(model, monkeypatch):
  """A bfloat16 model's pool holds uint16 bits: its decode program scatters them in place, with
  no float32 copy of a pool layer (XLA:CPU's bfloat16 scatter converts the whole layer to
  float32 and back: four passes over every page a token), and reads them as bfloat16; the
  embedding is gathered as its bits (XLA:CPU's bfloat16 gather converts the whole table)."""
  from morse_jax.llm import engine_steps, paged

  bf16 = llm.Model(CONFIG, jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.params),
                   stop_ids=(STOP,))
  engine = Engine(bf16, ENGINE)
  assert engine.pool.k[0].dtype == jnp.uint16 and engine.pool.dtype == jnp.bfloat16
  calls = []
  decode = engine_steps.decode

  def recorded(*args, **kwargs):
    calls.append((jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args),
                  kwargs))
    return decode(*args, **kwargs)

  monkeypatch.setattr(engine_steps, "decode", recorded)
  prompts = prompts_of([6, 19], seed=7)
  out = engine.generate(prompts, settings(8), rng=jax.random.key(5))
  for i, prompt in enumerate(prompts):  # the bits read back: the log-probs of a full forward
    reply = out.tokens[i, :out.lengths[i]].tolist()
    logits, _ = llm.forward(bf16.params, CONFIG, jnp.asarray([prompt + reply]))
    logp = jax.nn.log_softmax(logits[0, len(prompt) - 1:-1].astype(jnp.float32), axis=-1)
    want = np.asarray(jnp.take_along_axis(logp, jnp.asarray(reply)[:, None], axis=-1)[:, 0])
    np.testing.assert_allclose(out.logprobs[i, :len(reply)], want, atol=0.05)
  args, kwargs = calls[0]
  hlo = decode.lower(*args, **kwargs).compile().as_text()
  layer = engine.pool.k[0].shape
  assert f"f32[{','.join(map(str, layer))}]" not in hlo
  assert f"u16[{','.join(map(str, layer))}]" in hlo
  # nor of the embedding: it is gathered as its bits too
  assert f"f32[{CONFIG.vocab_size},{CONFIG.hidden_size}]" not in hlo
  assert engine.embed_bits is not None and engine.embed_bits.dtype == jnp.uint16
  # the bits, written and read back, are the bfloat16 values
  k = jax.random.normal(jax.random.key(1), (2, 3) + layer[1:2] + layer[3:], jnp.bfloat16)
  where = (jnp.asarray([[1, 1, 2], [3, 3, 3]]), jnp.asarray([[0, 1, 0], [4, 5, 6]]))
  bits = paged.write_pages(jnp.zeros(layer, jnp.uint16), where, k, jnp.bfloat16)
  back = paged.read_pages(bits[where[0], :, where[1]], jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(back), np.asarray(k.astype(jnp.float32)))
