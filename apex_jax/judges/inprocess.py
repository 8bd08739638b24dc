"""A loaded `morse_jax.llm.Model` as a chat backend: chat template -> one generation call for a
whole batch of conversations -> text, optionally through a fixed LoRA route.

`generate` is what the in-process judges and `serving.ChatBatcher` run: each row keeps its own
token limit and stop strings. Row i draws with fold_in(rng, i) whatever the batch around it, or
with its own key (a seeded request's, `seeded_keys`): its draws then depend on that key alone.
On one device the rows are requests on the chat's engine (`llm.engine`, built at the first call,
rebuilt larger when a batch outgrows it), each ending at its own limit or stop id; over a mesh
of several devices (the engine does not shard), and with `engine=False` (the test oracle), one
`llm.sample` call runs to the largest limit and a row's surplus tokens are dropped (its own
tokens unchanged, by the key rule). Stop strings cut the text afterwards either way.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from typing import Sequence

import jax
import jax.numpy as jnp

from morse_jax import llm
from morse_jax.llm import vision
from morse_jax.llm import vl as vl_lib
from morse_jax.llm.engine import Engine, EngineConfig, EngineError, Request, routes_of
from morse_jax.llm.sampling import bucket
from morse_jax.lora.experts import ExpertWeights, LoraConfig, make_adapter
from apex_jax.judges.chat import JudgeError, JudgeRequestError, JudgeResponseError

log = logging.getLogger(__name__)
PAGE_SIZE = 16  # tokens per KV page of the chats' engines


@dataclasses.dataclass(frozen=True)
class AdapterRoute:
  """Experts applied to every row: `expert_ids` of `experts` with uniform weights 1/|E|
  (as `morse_jax.mas.agents.Agents.generate` applies a row's expert set)."""

  experts: dict[str, ExpertWeights]
  lora: LoraConfig
  expert_ids: tuple[int, ...]
  kernel: str = "auto"

  def __post_init__(self):
    ids = self.lora.check_route(list(self.expert_ids), "AdapterRoute.expert_ids")
    object.__setattr__(self, "expert_ids", tuple(ids))


@dataclasses.dataclass(frozen=True)
class Completion:
  text: str
  finish_reason: str  # "stop" (EOS or a stop string) or "length" (the row's token limit)
  prompt_tokens: int
  completion_tokens: int
  token_ids: tuple[int, ...] = dataclasses.field(default=(), repr=False, compare=False)


def seeded_keys(seed: int, first: int, rows: int) -> jax.Array:
  """[rows] keys for choices first .. first + rows - 1 of a request with `seed` (a signed 64-bit
  integer: both halves count): functions of the seed and the choice index alone."""
  base = jax.random.fold_in(jax.random.PRNGKey(seed & 0xFFFFFFFF), (seed >> 32) & 0xFFFFFFFF)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(first + jnp.arange(rows))


def turn_key(row_key: jax.Array, offset: int) -> jax.Array:
  """A seeded row's key for the turn that starts after `offset` tokens of it (turns of a
  chunked request: a function of the row's key and its progress alone)."""
  return jax.random.fold_in(row_key, offset)


def check_messages(messages, parts: bool = False) -> list[dict]:
  """A chat as a list of {"role": str, "content": str}; JudgeRequestError naming what is wrong.
  parts: a content may also be a list of {"type": "text", "text": str} and {"type": "image"}
  parts (the HF chat form of a message with images)."""
  if not isinstance(messages, list) or not messages:
    raise JudgeRequestError(f"messages must be a non-empty list, got {str(messages)[:60]}")
  for i, m in enumerate(messages):
    if not isinstance(m, dict):
      raise JudgeRequestError(f"messages[{i}] must be an object, got {type(m).__name__}")
    if not isinstance(m.get("role"), str):
      raise JudgeRequestError(f"messages[{i}].role must be a string, got {m.get('role')!r:.40}")
    content = m.get("content")
    if not (isinstance(content, str) or parts and isinstance(content, list) and all(
        p == {"type": "image"} or isinstance(p, dict) and p.get("type") == "text"
        and isinstance(p.get("text"), str) and len(p) == 2 for p in content)):
      what = "a string or a list of text and image parts" if parts else "a string"
      raise JudgeRequestError(f"messages[{i}].content must be {what}, got {content!r:.40}")
  return messages


def _keys(rng: jax.Array, keys, rows: int) -> list[jax.Array]:
  """Each row's key: its own, or fold_in(rng, row) (what `sample` gives a row without one)."""
  keys = keys or [None] * rows
  return [jax.random.fold_in(rng, i) if k is None else k for i, k in enumerate(keys)]


def _row_keys(rng: jax.Array, keys) -> jax.Array | None:
  """`sample`'s row_keys (`_keys`); None when no row has its own."""
  if keys is None or all(k is None for k in keys):
    return None
  return jnp.stack(_keys(rng, keys, len(keys)))


def runs_on_engine(chat) -> bool:
  """Whether `chat` can generate on the engine: an InProcessChat on one device (the engine does
  not shard; a larger mesh keeps the merged `llm.sample` calls)."""
  mesh = getattr(chat, "mesh", None)
  return isinstance(chat, InProcessChat) and (mesh is None or mesh.size == 1)


def build_engine(chat: "InProcessChat", slots: int, cache_tokens: int, step_tokens: int = 8,
                 max_len: int | None = None, prefix_cache: bool = False) -> tuple[Engine, object]:
  """(an engine for `chat`'s route, the route row each of its requests carries: None without
  an adapter). Rows hold up to `max_len` tokens (None: `chat.max_context`); the pool
  `cache_tokens` (at least one full row), so admission waits for pages when long requests fill
  it; `step_tokens` new tokens per row per step; `prefix_cache`: `EngineConfig.prefix_cache`
  (the server's, `ChatLimits.prefix_cache`; the in-process judges keep it off, so that a judge's
  numbers never depend on which calls came before it)."""
  max_len = max_len or chat.max_context
  tokens = max(cache_tokens, max_len)
  # Decode programs per multiple of slots / 8 live rows (at least 4): as a ragged load's rows
  # end one by one, powers of two would pad 17 live rows to 32 (a quarter of the work wasted
  # on average); 8 or so programs more to compile.
  # Prefill the largest budget first: the longest reply sets when a burst is done.
  config = EngineConfig(slots=slots, max_len=max_len, page_size=PAGE_SIZE,
                        num_pages=-(-tokens // PAGE_SIZE) + 1,  # + the trash page
                        steps_per_call=step_tokens, decode_row_step=max(4, slots // 8),
                        prefill_order="longest", prefix_cache=prefix_cache)
  adapter = route = None
  if chat.route is not None:
    r = chat.route
    adapter = make_adapter(r.experts, r.lora, chat.model.config, [list(r.expert_ids)], r.kernel)
    route = routes_of(adapter)[0]
  return Engine(chat.vl or chat.model, config, adapter=adapter), route


class InProcessChat:
  """`complete` / `complete_many` on a model in this process (thread-safe; calls run one at a
  time). Sampling keys come from `seed` and a call counter, so a run is reproducible."""

  def __init__(self, model: llm.Model | vl_lib.VlModel, adapter_route: AdapterRoute | None = None,
               *, seed: int = 0, max_context: int | None = None, mesh=None,
               chat_template_kwargs: dict | None = None, engine: bool = True):
    # A Qwen2.5-VL model: its language model runs the text; its images go to the engine.
    self.vl = model if isinstance(model, vl_lib.VlModel) else None
    model = model.text if self.vl is not None else model
    if model.tokenizer is None:
      raise ValueError("InProcessChat: the model was loaded without a tokenizer")
    self.model, self.route, self.mesh = model, adapter_route, mesh
    self.max_context = max_context or model.config.max_position_embeddings
    self.chat_template_kwargs = dict(chat_template_kwargs or {})
    self._key = jax.random.PRNGKey(seed)
    self._calls = itertools.count()
    self._lock = threading.Lock()
    self.engine = engine  # False: `generate` runs `llm.sample` on one device too (the oracle)
    self._engine: tuple[Engine, object] | None = None  # (engine, route row), see `generate`
    self._engine_of: tuple = ()  # the (params, route) it was built with

  def prompt_tokens(self, messages, chat_template_kwargs: dict | None = None,
                    images: int = 0) -> list[int]:
    """The chat's prompt ids. images: how many {"type": "image"} parts the messages hold (a VL
    model's): the template's image pad for each is expanded to a 448 x 448 image's tokens."""
    messages = check_messages(messages, parts=images > 0)
    kwargs = {**self.chat_template_kwargs, **(chat_template_kwargs or {})}
    try:
      ids = self.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     **kwargs)
    except Exception as e:  # noqa: BLE001 -- jinja and tokenizer errors come in many types
      raise JudgeRequestError(f"chat template failed: {type(e).__name__}: {e}") from None
    return self._expand_images(ids, images) if images else ids

  def _expand_images(self, ids: list[int], images: int) -> list[int]:
    """As Qwen2.5-VL's processor: each image pad the template wrote becomes the image's
    merged tokens (256 for 448 x 448)."""
    if self.vl is None:
      raise JudgeRequestError(f"{images} image(s) given, but this model takes no images (a "
                              f"text-only model; a Qwen2.5-VL folder does)")
    config = self.vl.config
    written = ids.count(config.image_token_id)
    if written != images:
      raise JudgeRequestError(f"the chat template wrote {written} image pad tokens for "
                              f"{images} image(s): it must render {{'type': 'image'}} parts as "
                              f"Qwen2.5-VL's template does")
    per_image = config.image_tokens(vision.image_grid(config.vision))
    out = []
    for token in ids:
      out += [token] * per_image if token == config.image_token_id else [token]
    return out

  def check_length(self, prompt: Sequence[int], max_tokens: int) -> None:
    if not isinstance(max_tokens, int) or max_tokens < 1:
      raise JudgeRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if len(prompt) + max_tokens > self.max_context:
      raise JudgeRequestError(f"prompt of {len(prompt)} tokens + max_tokens {max_tokens} exceeds "
                              f"the context of {self.max_context} tokens")

  def generate(self, prompts: Sequence[list[int]], max_tokens: Sequence[int], *,
               temperature: float, top_p: float = 1.0,
               stops: Sequence[Sequence[str]] | None = None,
               keys: Sequence[jax.Array | None] | None = None) -> list[Completion]:
    """Completions of token-id prompts, all in one generation call (see the module docstring).
    keys: per row, a key of its own (its tokens then depend on that key, not on the call) or
    None (the call's key folded with the row's index, as without keys)."""
    if not prompts:
      return []
    try:
      sampling = llm.SamplingConfig(temperature=float(temperature), top_p=float(top_p))
    except (TypeError, ValueError) as e:
      raise JudgeRequestError(str(e)) from None
    stops = stops or [()] * len(prompts)
    with self._lock:
      rng = self.call_key()
      run = self._on_engine if self.engine and runs_on_engine(self) else self._sampled
      rows = run(list(prompts), list(max_tokens), sampling, rng, keys)
    return [self.completion(rows[i], len(prompts[i]), stops[i]) for i in range(len(prompts))]

  def _sampled(self, prompts, max_tokens, sampling, rng, keys) -> list:
    """Each row's tokens from one `llm.sample` call to the largest limit, cut at its own."""
    adapter = None
    if self.route is not None:
      adapter = make_adapter(self.route.experts, self.route.lora, self.model.config,
                             [list(self.route.expert_ids)] * len(prompts), self.route.kernel)
    settings = llm.GenerationSettings.for_model(self.model, max(max_tokens), sampling)
    out = llm.sample(self.model, prompts, settings, rng=rng, mesh=self.mesh, adapter=adapter,
                     row_keys=_row_keys(rng, keys))
    return [out.tokens[i, :min(int(out.lengths[i]), max_tokens[i])] for i in range(len(prompts))]

  def _on_engine(self, prompts, max_tokens, sampling, rng, keys) -> list:
    """Each row's tokens as a request on the chat's engine, with its own limit and key."""
    engine, route = self._engine_for(prompts, max_tokens)
    try:
      handles = [engine.submit(Request(p, m, sampling, None, k, route))
                 for p, m, k in zip(prompts, max_tokens, _keys(rng, keys, len(prompts)))]
      engine.run()
      return [h.result().tokens for h in handles]
    except Exception:
      self._engine = None  # requests of this call may be left in it: a fresh one next call
      raise

  def _engine_for(self, prompts, max_tokens) -> tuple[Engine, object]:
    """The chat's engine, built (again) when this batch has more rows than its slots or a row
    longer than its rows, or the chat's params or route were replaced (the engine holds what
    it was built with): a slot per row, rows of a power of two of tokens (few sizes, each a set
    of compiled programs), a pool holding every slot full."""
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens))
    slots = bucket(len(prompts), minimum=1)
    max_len = min(bucket(longest, minimum=PAGE_SIZE), self.max_context)
    source = (self.model.params, self.route)
    if self._engine is not None and all(a is b for a, b in zip(source, self._engine_of)):
      config = self._engine[0].config
      if slots <= config.slots and longest <= config.max_len:
        return self._engine
      slots, max_len = max(slots, config.slots), max(max_len, config.max_len)
    self._engine = build_engine(self, slots, slots * max_len, max_len=max_len)
    self._engine_of = source
    return self._engine

  def call_key(self) -> jax.Array:
    """The next call's key: the seed folded with a call counter (a reproducible run)."""
    return jax.random.fold_in(self._key, next(self._calls))

  def completion(self, ids, prompt_len: int, stop: Sequence[str]) -> Completion:
    """The Completion of generated token ids (cut at the first stop string)."""
    ids = [int(t) for t in ids]
    ended = bool(ids) and ids[-1] in self.model.stop_ids
    text = self.model.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stop if s and s in text]
    if cuts:
      text, ended = text[:min(cuts)], True
    return Completion(text, "stop" if ended else "length", prompt_len, len(ids), tuple(ids))

  def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str:
    reply = self.complete_many([messages], max_tokens=max_tokens, temperature=temperature)[0]
    if isinstance(reply, JudgeError):
      raise reply
    return reply

  def complete_many(self, conversations: Sequence[list[dict]], *, max_tokens: int,
                    temperature: float) -> list[str | JudgeError]:
    """All valid conversations in one generation call; an invalid one gets its
    JudgeRequestError; a call the engine fails (a non-finite row: broken weights) gives every
    row of it a JudgeResponseError, which the judges count as failures."""
    out: list[str | JudgeError] = [None] * len(conversations)  # type: ignore[list-item]
    rows, prompts = [], []
    for i, messages in enumerate(conversations):
      try:
        prompt = self.prompt_tokens(messages)
        self.check_length(prompt, max_tokens)
      except JudgeRequestError as e:
        out[i] = e
        continue
      rows.append(i)
      prompts.append(prompt)
    try:
      done = self.generate(prompts, [max_tokens] * len(prompts), temperature=temperature)
    except EngineError as e:
      log.warning("in-process chat: %d rows failed: %.200s", len(rows), e)
      done = [JudgeResponseError(f"generation failed: {e}")] * len(rows)
    for i, completion in zip(rows, done):
      out[i] = completion if isinstance(completion, JudgeError) else completion.text
    return out
