"""Batched generation: one jitted prefill plus an on-device decode loop (`lax.while_loop`).

Rows, prompt length and generation length are bucketed to powers of two, so calls with similar
sizes reuse one compiled program. The loop stops on device when every row has emitted an EOS id or
the requested number of tokens; nothing returns to the host per token.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm.bundle import Model
from morse_jax.llm.config import LlmConfig
from morse_jax.llm import sharding as sharding_lib
from morse_jax.llm import fused_decode
from morse_jax.llm.model import KVCache, WeightBits, bits_view, forward, init_cache
from morse_jax.llm.params import Params
from morse_jax.llm.vl import ImageRows, embed_rows


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """temperature 0 means greedy. top_k 0 and top_p 1 switch those filters off."""

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature!r}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
    if self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k must be >= 0, got {self.top_k!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


GREEDY = SamplingConfig(temperature=0.0)
PREFILL_CHUNK = 512  # prompt tokens per row per prefill pass (see `prefill`)
PREFILL_TOKENS = 4096  # prompt tokens of all rows per prefill pass (see `prefill`)


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
  """The static settings of a generation call in one frozen, hashable object, as `rl.update.Update`
  is for the train step: `generate_padded`'s static argument.

  Per request (what a continuous-batching engine would take with each request):
    max_new_tokens: the most tokens to generate (in `generate_padded`: the static capacity, a
      bucket; the count itself is traced, so similar counts share one compiled program).
    sampling: temperature and filters.
  Per model and engine (`for_model` fills the model's):
    eos_ids: a row stops after emitting one; pad_id: written after the stop.
    unstack: the decode loop's weight layout, `fused_decode`'s per-layer [in, out] copies (faster
      on CPU, one copy of the layers per call) or the stored stack (False); None: on for the CPU
      backend when the copy is small (`default_unstack`: SmolLM2 yes, Qwen2.5-Coder-1.5B no).
    prefill_chunk: the prompt is prefilled in chunks of at most this many tokens (`prefill`).
  Per call:
    prompt_repeats: r when rows come in runs of r equal prompts with equal routes (a B x M
      rollout's candidates): each run's prompt is prefilled once and its cache repeated r times.
  """

  max_new_tokens: int
  sampling: SamplingConfig = SamplingConfig()
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  prompt_repeats: int = 1
  unstack: bool | None = None
  prefill_chunk: int = PREFILL_CHUNK

  def __post_init__(self):
    for name in ("max_new_tokens", "prompt_repeats", "prefill_chunk"):
      value = getattr(self, name)
      if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"GenerationSettings.{name} must be an int >= 1, got {value!r}")
      object.__setattr__(self, name, int(value))
    if not isinstance(self.sampling, SamplingConfig):
      raise ValueError(f"GenerationSettings.sampling must be a SamplingConfig, got "
                       f"{self.sampling!r}")
    # Hashable whatever sequence the caller has (a list, a numpy array of a tokenizer's ids).
    object.__setattr__(self, "eos_ids", tuple(int(e) for e in self.eos_ids))

  @classmethod
  def for_model(cls, model: Model, max_new_tokens: int,
                sampling: SamplingConfig = SamplingConfig(), **rest) -> GenerationSettings:
    """These per-request settings with `model`'s stop ids and pad id."""
    return cls(max_new_tokens, sampling, eos_ids=model.stop_ids, pad_id=model.pad_id, **rest)


@dataclasses.dataclass
class SampleOutput:
  tokens: np.ndarray  # [rows, max_new] int32, pad_id after the end
  logprobs: np.ndarray  # [rows, max_new] float32, log p of each token under the sampling dist.
  lengths: np.ndarray  # [rows] int32, generated tokens including the EOS token


def bucket(n: int, minimum: int = 16) -> int:
  """Smallest power of two >= max(n, minimum)."""
  return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def length_bucket(n: int, minimum: int = 16) -> int:
  """Smallest 2^k or 3 * 2^(k-1) >= max(n, minimum): at most a third of padding where a power of
  two wastes up to half (an update's attention cost grows with its square), for only twice as
  many distinct (compiled) shapes."""
  p = bucket(n, minimum)
  three_quarters = 3 * p // 4
  return three_quarters if p >= 4 and three_quarters >= max(n, minimum) else p


def _filter_logits(logits, sampling: SamplingConfig):
  """Temperature, top-k and top-p applied to [b, v] f32 logits; removed entries become -inf."""
  logits = logits / sampling.temperature
  if sampling.top_k:
    kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if sampling.top_p < 1.0:
    probs = jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(probs < top_p_threshold(probs, sampling.top_p), -jnp.inf, logits)
  return logits


def top_p_threshold(probs, top_p: float):
  """The nucleus cut-off [b, 1]: the largest t with sum(probs[probs >= t]) >= top_p.

  Keeping probs >= t is the set a descending sort keeps (tokens while the mass before them is
  < top_p), ties included. A sort over the vocabulary per step is slow on CPU; instead this
  bisects the int32 bit patterns of non-negative float32 values, which are ordered like the
  values, so 31 masked sums find t exactly.
  """
  return largest_threshold(
      probs, lambda t: jnp.sum(jnp.where(probs >= t, probs, 0.0), axis=-1) >= top_p)


def largest_threshold(probs, reaches):
  """[b, 1]: per row the largest t with reaches(t [b, 1]) True, for a test that holds at t = 0
  and weakens as t grows (a nucleus's mass, a count of entries >= t): a bisection over the int32
  bit patterns of non-negative float32 values, which are ordered like the values, 31 steps."""
  lo = jnp.zeros(probs.shape[:1], jnp.int32)  # t = 0: every entry kept
  hi = jax.lax.bitcast_convert_type(jnp.max(probs, axis=-1), jnp.int32) + 1  # keeps nothing

  def step(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = reaches(jax.lax.bitcast_convert_type(mid, jnp.float32)[:, None])
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = jax.lax.fori_loop(0, 31, step, (lo, hi))
  return jax.lax.bitcast_convert_type(lo, jnp.float32)[:, None]


def inverse_cdf(probs, uniform):
  """Index j with cdf[j-1] <= u * total < cdf[j], per row: an exact categorical draw.

  One uniform per row instead of Gumbel-max's one per vocabulary entry: per-row Gumbel noise over
  a 32k vocabulary cost 3x this on CPU. Entries of probability 0 are never chosen.
  """
  cdf = jnp.cumsum(probs, axis=-1)
  target = uniform * cdf[:, -1]
  index = jnp.sum(cdf <= target[:, None], axis=-1)
  # u * total can round up to total; fall back to the most likely token, never a removed one.
  return jnp.where(index < probs.shape[-1], index, jnp.argmax(probs, axis=-1))


def _choose(logits, keys, step, sampling: SamplingConfig):
  """One token per row and its log-prob under the distribution it was drawn from."""
  if sampling.greedy:
    token = jnp.argmax(logits, axis=-1)
    logp = jax.nn.log_softmax(logits, axis=-1)
  else:
    logp = jax.nn.log_softmax(_filter_logits(logits, sampling), axis=-1)
    uniform = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, step)))(keys)
    token = inverse_cdf(jnp.exp(logp), uniform)
  token = token.astype(jnp.int32)
  return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def prefill(params: Params, config: LlmConfig, tokens, attention_mask, cache: KVCache,
            adapter=None, chunk: int = PREFILL_CHUNK, bits: WeightBits | None = None,
            images: ImageRows | None = None):
  """The prompt's pass into the cache; (last-slot logits [b, 1, v], cache).

  A prompt longer than `chunk` runs in chunks of at most `chunk` tokens (a scan over one
  compiled chunk): a chunk's attention scores are [b, h, chunk, cache slots] where one pass
  would hold [b, h, prompt, cache slots] (a 4654-token SciCode prompt at 16 rows: 83 GB). The
  chunk is the largest power of two <= `chunk` and <= PREFILL_TOKENS / rows dividing the
  prompt's (bucketed) length: the MLP's activations and the scores grow with rows x chunk
  (32 rows x 512 tokens of Qwen2.5-1.5B: 0.8 GB of scores and 0.6 GB per MLP activation).
  images: a Qwen2.5-VL batch's image inputs (`vl.ImageRows`: the image pads' features, mrope
  streams), split into the same chunks."""
  b, p = tokens.shape
  chunk = max(1, min(chunk, PREFILL_TOKENS // b))
  c = 1 << (max(1, min(chunk, p)).bit_length() - 1)
  while p % c:
    c //= 2
  def run(cache, tokens, mask, index=None, positions=None):
    embeds = streams = None
    if images is not None:
      chunk_images = ImageRows(images.features, index, positions)
      embeds, streams = embed_rows(params.embed, tokens, chunk_images), chunk_images.streams
    return forward(params, config, tokens, streams, mask, cache, last_only=True,
                   adapter=adapter, bits=bits, embeds=embeds)

  per_token = () if images is None else (images.index, images.positions)
  if c >= p:
    return run(cache, tokens, attention_mask, *per_token)
  n = p // c
  split = lambda a: jnp.moveaxis(a.reshape(a.shape[:-1] + (n, c)), -2, 0)

  def body(cache, xs):
    logits, cache = run(cache, *xs)
    return cache, logits

  xs = tuple(split(a) for a in (tokens, attention_mask) + per_token)
  cache, logits = jax.lax.scan(body, cache, xs)
  return logits[-1], cache


@functools.partial(jax.jit, static_argnames=("config", "settings", "mesh", "rules"))
def generate_padded(params: Params, config: LlmConfig, tokens, attention_mask, keys, max_new,
                    settings: GenerationSettings, *, mesh=None,
                    rules: sharding_lib.ShardingRules | None = None, adapter=None, active=None,
                    bits: WeightBits | None = None, images: ImageRows | None = None):
  """Generates from left-padded prompts, all on device.

  Args:
    tokens, attention_mask: [b, p] left-padded prompts and their mask.
    keys: [b] PRNG keys, one per row (rows are reproducible whatever the batch around them).
    max_new: [] int32, tokens to generate (<= settings.max_new_tokens); traced, so it does not
      recompile.
    settings: static; its max_new_tokens is the capacity of the output and of the cache beyond
      the prompt (`sample` gives the bucket), unstack None scans the stored layers.
    adapter: optional per-row adapter (`model.Adapter`; morse_jax.lora.Adapter: each row runs
      with its own mixture of experts).
    mesh, rules: when given, the cache is laid out by `rules` on `mesh` (rows over the batch axis,
      kv heads over the model axis) instead of wherever propagation would put it.
    active: [b] bool, False for padding rows: they count as finished from the start, so the loop
      can stop as soon as every real row has emitted an EOS id.
    bits: `model.bits_view(params)` (CPU, 16-bit weights): the prefill and the scanned decode
      read the weights through it, so XLA:CPU makes no float32 copy of them.
    images: a Qwen2.5-VL batch's image inputs for the prefill (`vl.ImageRows`, `prefill`); the
      decode steps go on from each row's largest prompt position + 1 (the cache's `next_pos`),
      so a row keeps its image offset.

  Returns:
    tokens [b, settings.max_new_tokens], logprobs [b, same], lengths [b].
  """
  b, p = tokens.shape
  gen_len, pad_id, r = settings.max_new_tokens, settings.pad_id, settings.prompt_repeats
  firsts = lambda x: x[::r]  # one row of each run
  constrain = lambda cache: cache if mesh is None else jax.lax.with_sharding_constraint(
      cache, sharding_lib.cache_shardings(cache, mesh, rules or sharding_lib.ShardingRules()))
  cache = init_cache(config, b // r, p + gen_len, params.embed.dtype)
  if r == 1:
    cache = constrain(cache)
  prefill_adapter = None if adapter is None else adapter.map_rows(firsts)
  logits, cache = prefill(params, config, firsts(tokens), firsts(attention_mask), cache,
                          prefill_adapter, settings.prefill_chunk, bits,
                          None if images is None else jax.tree.map(firsts, images))
  if r > 1:
    rep = lambda x, axis: jnp.repeat(x, r, axis=axis)
    logits = rep(logits, 0)
    cache = KVCache(k=rep(cache.k, 1), v=rep(cache.v, 1), valid=rep(cache.valid, 0),
                    length=cache.length, next_pos=rep(cache.next_pos, 0))
    cache = constrain(cache)
  run_layers = None
  if settings.unstack:  # the decode loop's weight layout, chosen once for every step
    params, cache = fused_decode.decode_layout(params, cache)
    run_layers = fused_decode.run_layers
  eos = jnp.asarray(settings.eos_ids or (-1,), jnp.int32)
  out_tokens = jnp.full((b, gen_len), pad_id, jnp.int32)
  out_logp = jnp.zeros((b, gen_len), jnp.float32)
  done = jnp.zeros((b,), bool) if active is None else ~active
  lengths = jnp.zeros((b,), jnp.int32)

  def cond(state):
    step, _, _, done, *_ = state
    return (step < max_new) & ~jnp.all(done)

  def body(state):
    step, logits, cache, done, out_tokens, out_logp, lengths = state
    token, logp = _choose(logits[:, -1], keys, step, settings.sampling)
    token = jnp.where(done, pad_id, token)
    logp = jnp.where(done, 0.0, logp)
    out_tokens = out_tokens.at[:, step].set(token)
    out_logp = out_logp.at[:, step].set(logp)
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | jnp.isin(token, eos)
    logits, cache = forward(params, config, token[:, None], cache=cache, adapter=adapter,
                            run_layers=run_layers, bits=bits)
    return step + 1, logits, cache, done, out_tokens, out_logp, lengths

  state = (jnp.zeros((), jnp.int32), logits, cache, done, out_tokens, out_logp, lengths)
  state = jax.lax.while_loop(cond, body, state)
  return state[4], state[5], state[6]


def default_unstack(params: Params) -> bool:
  """`GenerationSettings.unstack` unless told: the fused CPU decode layout where it fits."""
  return jax.default_backend() == "cpu" and fused_decode.fits(params)


def left_pad(prompts: Sequence[Sequence[int]], length: int, rows: int, pad_id: int):
  """[rows, length] tokens and mask; rows beyond the prompts hold one pad token."""
  tokens = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  for i in range(rows):
    prompt = prompts[i] if i < len(prompts) else [pad_id]
    if len(prompt):
      tokens[i, length - len(prompt):] = prompt
      mask[i, length - len(prompt):] = 1
  return tokens, mask


def _pad_routes(adapter, n: int, rows: int):
  """Routes for the bucketed rows: padding rows repeat row 0's route (their output is dropped)."""
  have = jax.tree.leaves(adapter.row_data)[0].shape[0]
  if have != n:
    raise ValueError(f"sample: the adapter has routes for {have} rows, not the {n} prompts")
  pad = lambda a: jnp.concatenate([a, jnp.repeat(a[:1], rows - n, axis=0)], axis=0)
  return adapter.map_rows(pad)


def check_runs(prompts, row_data, r: int, caller: str = "sample") -> None:
  """Prompts (and the adapter's per-row data: routes) must come in runs of r equal ones for
  `prompt_repeats=r`."""
  if len(prompts) % r:
    raise ValueError(f"{caller}: prompt_repeats={r!r} must be an int >= 1 dividing the "
                     f"{len(prompts)} prompts")
  routes = [] if row_data is None else [np.asarray(a) for a in jax.tree.leaves(row_data)]
  for i in range(0, len(prompts), r):
    for j in range(i + 1, i + r):
      same_route = all(np.array_equal(a[j], a[i]) for a in routes)
      if list(prompts[j]) != list(prompts[i]) or not same_route:
        raise ValueError(f"{caller}: prompt_repeats={r}: row {j} differs from row {i} of its "
                         f"run ({'prompt' if same_route else 'route'})")


def sample(model: Model, prompts: Sequence[Sequence[int]], settings: GenerationSettings, *,
           rng: jax.Array, adapter=None, row_keys=None, mesh=None,
           rules: sharding_lib.ShardingRules | None = None,
           image_rows=None) -> SampleOutput:
  """Samples continuations of token-id prompts of any lengths with `model`'s params and config.

  settings: the call's `GenerationSettings` (`GenerationSettings.for_model` takes the model's
    stop ids and pad id); its prompt_repeats is checked against the prompts and routes.
  rng: one PRNG key; row i uses fold_in(rng, i), so a row's tokens do not depend on batch size.
  adapter: optional morse_jax.lora Adapter whose routes have one row per prompt.
  row_keys: optional [len(prompts)] keys, row i's instead of fold_in(rng, i) (a row that keeps
    its key draws the same wherever it sits in the batch).
  mesh, rules: a device mesh (and ShardingRules, default ones) to run on: rows are padded to a
    multiple of the batch axis and placed over it; pass params already placed with
    `sharding.shard_params` on the same mesh.
  image_rows: optional (tokens [rows, p], mask [rows, p], numpy, left-padded and bucketed)
    -> `vl.ImageRows`: the prompts' image inputs (`vl_sampling.sample`), placed as the rows.
  """
  params, config = model.params, model.config
  if not prompts:
    raise ValueError("sample: prompts is empty")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("sample: every prompt needs at least one token")
  too_big = [t for p in prompts for t in p if not 0 <= t < config.vocab_size]
  if too_big:
    raise ValueError(f"sample: token id {too_big[0]} is outside the vocabulary "
                     f"[0, {config.vocab_size})")
  check_runs(prompts, None if adapter is None else adapter.row_data, settings.prompt_repeats)
  longest = max(len(p) for p in prompts) + settings.max_new_tokens
  if longest > config.max_position_embeddings:
    raise ValueError(f"sample: a prompt of {max(len(p) for p in prompts)} tokens plus "
                     f"max_new_tokens {settings.max_new_tokens} is {longest} positions, more than "
                     f"the model's max_position_embeddings ({config.max_position_embeddings})")
  rows = bucket(len(prompts), minimum=1)
  rules = rules or sharding_lib.ShardingRules()
  multiple = settings.prompt_repeats
  if mesh is not None and rules.batch is not None:
    multiple = math.lcm(multiple, mesh.shape[rules.batch])
  rows = -(-rows // multiple) * multiple
  prompt_len = length_bucket(max(len(p) for p in prompts))  # prefill and cache grow with it
  tokens, mask = left_pad(prompts, prompt_len, rows, settings.pad_id)
  images = None if image_rows is None else image_rows(tokens, mask)
  keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(rows))
  if row_keys is not None:
    row_keys = jnp.asarray(row_keys)
    want = (len(prompts),) + keys.shape[1:]
    if row_keys.shape != want or row_keys.dtype != keys.dtype:
      raise ValueError(f"sample: row_keys must be {want} keys of rng's kind ({keys.dtype}), one "
                       f"per prompt; got shape {row_keys.shape} {row_keys.dtype}")
    keys = jnp.concatenate([row_keys, keys[len(prompts):]])
  active = jnp.asarray(np.arange(rows) < len(prompts))
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  if adapter is not None:
    adapter = _pad_routes(adapter, len(prompts), rows)
  if mesh is not None:
    place = sharding_lib.shard_rows(mesh, rules)
    tokens, mask, keys, active = place(tokens, mask, keys, active)
    images = jax.tree.map(lambda a: place(a)[0], images)
  # Compiled for the generation length's bucket, the count itself traced; the layout chosen.
  compiled = dataclasses.replace(
      settings, max_new_tokens=bucket(settings.max_new_tokens),
      unstack=default_unstack(params) if settings.unstack is None else settings.unstack)
  out_tokens, out_logp, lengths = generate_padded(
      params, config, tokens, mask, keys, jnp.int32(settings.max_new_tokens), compiled,
      mesh=mesh, rules=None if mesh is None else rules, adapter=adapter, active=active,
      bits=bits_view(params), images=images)
  n, new = len(prompts), settings.max_new_tokens
  out_tokens, out_logp, lengths = sharding_lib.to_host((out_tokens, out_logp, lengths))
  return SampleOutput(tokens=out_tokens[:n, :new], logprobs=out_logp[:n, :new],
                      lengths=lengths[:n])
