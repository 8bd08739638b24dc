"""One generation engine: S slots over a paged KV cache, continuous batching.

A `Request` (prompt tokens, token budget, sampling settings, stop ids, its own rng key, and
optionally its row of the engine's per-row adapter: a mixture of LoRA experts) is `submit`ted
and gets a `Handle`; `submit_group` gives n samples of one prompt that share its pages. Each
`step`:

1. admits waiting requests into free slots, first come first served, when the pool can hold
   everything they could still need beside the running rows' own worst case (`pages.py`:
   reservations; pages are allocated only as tokens are written); with
   `EngineConfig.prefix_cache`, a prompt that begins with pages a finished row left in the
   cache (`prefix_cache.py`: an agent's last turn) starts after them;
2. prefills one chunk of at most `prefill_chunk` tokens for up to `prefill_rows` admitted rows
   (in `prefill_order`; a long prompt takes several steps, interleaved with decoding); a row whose prompt is done
   gets its first logits, and a group's other members get the leader's full prompt pages
   (reference counts) and a copy of its partly filled last page;
3. decodes every live row `steps_per_call` tokens in one jitted while loop (one host round trip),
   compiled per power-of-two count of live rows, at least `min_decode_rows`: with 3 rows live
   of 32 slots a step costs a 4-row program (the attention over pages: a C++ kernel on CPU,
   `cpu_attention.py`). A row that emits a stop id or reaches its budget frees its slot and
   pages as soon as the host reads the call's result.

A row's draws use `fold_in(its key, tokens generated so far)`, as `sampling.sample` does per row,
so a request's samples do not depend on arrival order, slot or the rows around it; greedy rows
give `sample`'s tokens (tested, up to float near-ties between two summation orders).

Qwen2.5-VL: an engine built on a `vl.VlModel` takes requests with `images` (`engine_images`):
the tower runs at a request's first prefill chunk, each chunk puts its image tokens in place of
the image pads and rotates by the prompt's three position streams, and decoding rotates each row
at slot + its rope delta. A text model's engine runs the programs it ran before.

Errors: bad requests are refused at submission naming the field and value; a device call that
fails fails the requests it carried; a row whose log-prob comes back non-finite (a NaN route)
fails alone, the others go on.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm import engine_images, engine_steps, fused_decode, paged, vl
from morse_jax.llm.bundle import Model
from morse_jax.llm.model import bits_view
from morse_jax.llm.pages import TRASH_PAGE, PageAllocator
from morse_jax.llm.prefix_cache import PrefixCache, root_of
from morse_jax.llm.paged import PagedRows
from morse_jax.llm.sampling import (GenerationSettings, SampleOutput, SamplingConfig, bucket,
                                    check_runs, default_unstack)


PREFILL_ORDERS = ("arrival", "longest")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """The engine's sizes (static: each compiled program depends on them).

  slots: rows decoded together at most.
  max_len: a row's capacity in tokens (prompt + budget), at most the model's positions.
  page_size: tokens per KV page.
  num_pages: pages in the pool including the trash page; None: enough for every slot at
    max_len (a smaller pool makes admission wait for pages instead of slots).
  steps_per_call: tokens decoded per live row per host round trip.
  min_decode_rows: the smallest decode program (a power of two): each smaller one is one more
    compile (about 6 s for SmolLM2 on CPU) and saves little, as a step of few rows costs about
    its weight reads whatever the row count.
  decode_row_step: 0: a decode program per power of two of live rows; k: per multiple of k
    above `min_decode_rows` (more programs, less padding while rows end one by one, as under a
    server's ragged load: 17 live rows cost 20 rows with k = 4, not 32).
  prefill_chunk: prompt tokens per row per prefill pass (a power of two).
  prefill_rows: rows prefilled per step.
  min_prefill_rows: the smallest prefill program (a power of two): fewer programs (compiles)
    for padding rows in a pass.
  prefill_order: which admitted rows are prefilled first: "arrival" (admission order) or
    "longest" (the largest token budget first, then admission order): the longest reply sets
    the end of a batch of ragged requests, so starting it first shortens the tail (a server's
    ragged load: its 480-token request no longer waits behind 31 prompts).
  block_pages: pages per block of the paged attention's online softmax.
  unstack: the CPU decode layout (`fused_decode`, one copy of the layers for the engine's
    life); None: `sampling.default_unstack`.
  prefix_cache: keep finished rows' full pages and start a request whose prompt begins with
    them after them (`prefix_cache.py`: an agent's next turn, a group's samples sent one by one);
    the cache's pages count as held until an admission evicts them.
  """

  slots: int = 8
  max_len: int = 1024
  page_size: int = 16
  num_pages: int | None = None
  steps_per_call: int = 8
  min_decode_rows: int = 4
  decode_row_step: int = 0
  prefill_chunk: int = 128
  prefill_rows: int = 4
  min_prefill_rows: int = 1
  prefill_order: str = "arrival"
  block_pages: int = 16
  unstack: bool | None = None
  prefix_cache: bool = False

  def __post_init__(self):
    for name in ("slots", "max_len", "page_size", "steps_per_call", "min_decode_rows",
                 "prefill_chunk", "prefill_rows", "min_prefill_rows", "block_pages"):
      value = getattr(self, name)
      if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")
    for name in ("prefill_chunk", "min_decode_rows", "min_prefill_rows"):
      value = getattr(self, name)
      if value & (value - 1):
        raise ValueError(f"EngineConfig.{name} must be a power of two, got {value!r}")
    if not isinstance(self.decode_row_step, numbers.Integral) or self.decode_row_step < 0:
      raise ValueError(f"EngineConfig.decode_row_step must be an int >= 0, got "
                       f"{self.decode_row_step!r}")
    if self.prefill_order not in PREFILL_ORDERS:
      raise ValueError(f"EngineConfig.prefill_order must be one of {PREFILL_ORDERS}, got "
                       f"{self.prefill_order!r}")
    if not isinstance(self.prefix_cache, bool):
      raise ValueError(f"EngineConfig.prefix_cache must be a bool, got {self.prefix_cache!r}")
    if self.num_pages is not None and self.num_pages < 2:
      raise ValueError(f"EngineConfig.num_pages must be >= 2, got {self.num_pages!r}")

  @property
  def pages_per_row(self) -> int:
    return -(-self.max_len // self.page_size)


@dataclasses.dataclass
class Request:
  """One generation request.

  prompt: token ids (at least one).
  max_new_tokens: the token budget (>= 1).
  sampling: temperature (0: greedy), top_p, top_k.
  stop_ids: the row ends after emitting one; None: the model's stop ids.
  rng: this request's PRNG key (its draws depend on nothing else); None: key(0).
  route: this row of the engine adapter's per-row data (`Adapter.row_data` without the row
    axis, e.g. a `lora.Routes` of [e] ids and weights; `routes_of` splits an adapter's rows);
    required when the engine has an adapter, refused when it has none.
  images: Qwen2.5-VL only: the prompt's images in order, each normalised [3, H, W]
    (`vision.normalize`), as many image pad tokens in the prompt as they take.
  """

  prompt: Sequence[int]
  max_new_tokens: int
  sampling: SamplingConfig = SamplingConfig()
  stop_ids: Sequence[int] | None = None
  rng: jax.Array | None = None
  route: Any = None
  images: Sequence[np.ndarray] = ()


@dataclasses.dataclass
class Completion:
  tokens: np.ndarray  # [n] int32, the stop id included
  logprobs: np.ndarray  # [n] float32, log p of each token under the distribution it came from
  finish_reason: str  # "stop", "length", "cancelled"


class EngineError(RuntimeError):
  """A request failed in the engine (its device call, or a non-finite result of its row)."""


class Handle:
  """A submitted request's tokens as they come: `poll` (no engine work), `stream` (drives the
  engine until the row is done), `result` (the whole completion), `cancel`."""

  def __init__(self, engine: "Engine", request: Request, key_data: np.ndarray):
    self._engine, self.request, self.key_data = engine, request, key_data
    self.tokens: list[int] = []
    self.logprobs: list[float] = []
    self.finish_reason: str | None = None
    self.error: Exception | None = None
    self._read = 0
    self._cancelled = False

  @property
  def done(self) -> bool:
    return self.finish_reason is not None

  def poll(self) -> list[int]:
    """The tokens that came since the last poll."""
    new = self.tokens[self._read:]
    self._read = len(self.tokens)
    return new

  def stream(self) -> Iterator[int]:
    """Each token as it comes, stepping the engine while this row is running."""
    while True:
      yield from self.poll()
      if self.done:
        if self.error is not None:
          raise self.error
        return
      self._engine.step()

  def result(self) -> Completion:
    while not self.done:
      self._engine.step()
    if self.error is not None:
      raise self.error
    return Completion(np.asarray(self.tokens, np.int32), np.asarray(self.logprobs, np.float32),
                      self.finish_reason)

  def cancel(self) -> None:
    """Stop this request: its slot and pages are freed at the next step."""
    self._cancelled = True


@dataclasses.dataclass
class _Row:
  """A slot's host state."""

  handle: Handle
  prompt: np.ndarray
  stops: np.ndarray
  route: list | None  # leaves of the row's route
  reserved: int  # pages it may still allocate
  order: int  # admission order: prefill goes oldest first
  images: engine_images.RowImages | None  # a VL engine's row: its streams, rope delta, images
  root: bytes | None  # its prefix-cache chain's start; None: the row is not cached
  prompt_keys: list  # the chain keys of its prompt's full pages found at admission
  state: str = "prefill"  # "prefill", "wait" (a group member before its leader's prompt), "decode"
  prefilled: int = 0
  length: int = 0  # tokens in the pool
  generated: int = 0
  pages: list = dataclasses.field(default_factory=list)
  members: list = dataclasses.field(default_factory=list)  # a group leader's other rows

  @property
  def budget(self) -> int:
    return self.handle.request.max_new_tokens


class Engine:
  """S slots over a paged KV cache; see the module docstring."""

  def __init__(self, model: Model | vl.VlModel, config: EngineConfig = EngineConfig(), *,
               adapter=None):
    # A VL model: its language model runs the programs, the tower runs per request.
    self.vl = model if isinstance(model, vl.VlModel) else None
    model = model.text if self.vl is not None else model
    mc = model.config
    if config.max_len > mc.max_position_embeddings:
      raise ValueError(f"EngineConfig.max_len {config.max_len} is more than the model's "
                       f"max_position_embeddings ({mc.max_position_embeddings})")
    self.model, self.config = model, config
    num_pages = config.num_pages or config.slots * config.pages_per_row + 1
    if num_pages - 1 < config.pages_per_row:
      raise ValueError(f"EngineConfig.num_pages {num_pages} cannot hold one row of max_len "
                       f"{config.max_len} ({config.pages_per_row} pages + the trash page)")
    self.pages = PageAllocator(num_pages, config.page_size)
    self.prefix = PrefixCache(self.pages) if config.prefix_cache else None
    self.pool = paged.init_pool(mc, num_pages, config.page_size, model.params.embed.dtype)
    self.pending = jnp.zeros((config.slots, mc.vocab_size), jnp.float32)
    unstack = default_unstack(model.params) if config.unstack is None else config.unstack
    # One program builds the copy (op by op it compiled a dozen small programs).
    self.fused = jax.jit(fused_decode.decode_layers)(model.params.layers) if unstack else None
    # A 16-bit embedding gathered as its bits (`paged.forward_paged`; a view, made outside jit).
    bits = bits_view(model.params)
    self.embed_bits = None if bits is None else bits.embed
    if adapter is not None and getattr(adapter, "kernel", None) == "merged":
      # "merged" folds row 0's route into W for the whole batch: the engine's rows differ.
      adapter = dataclasses.replace(adapter, kernel="auto")
    self.adapter = adapter
    self._route_template = (None if adapter is None else
                            [np.asarray(a)[0] for a in jax.tree.leaves(adapter.row_data)])
    self.slots: list[_Row | None] = [None] * config.slots
    self.waiting: collections.deque = collections.deque()
    self._admitted = 0
    self.stats = collections.Counter()

  # -- submission ---------------------------------------------------------------------------

  def submit(self, request: Request) -> Handle:
    """Queues `request`; its handle. Refuses a bad request (ValueError naming the field)."""
    return self.submit_group(request, 1)[0]

  def submit_group(self, request: Request, n: int, keys: Sequence | None = None) -> list[Handle]:
    """n samples of `request` that share its prompt's pages: member j draws with
    fold_in(request.rng, j) (as `sample`'s row j of one rng), or with keys[j] when given (a
    rollout's rows keep the keys the static sampler gives them)."""
    if not isinstance(n, numbers.Integral) or not 1 <= n <= self.config.slots:
      raise ValueError(f"submit_group: n must be an int in [1, {self.config.slots}] (the "
                       f"engine's slots), got {n!r}")
    prompt, stops, route, key = self._check(request)
    images = self._images(request, prompt)
    if keys is not None:
      if len(keys) != n:
        raise ValueError(f"submit_group: keys holds {len(keys)} keys for n = {n} samples")
      key_data = [self._check(dataclasses.replace(request, rng=k))[3] for k in keys]
    elif n > 1:
      keys = [jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(key), j))
              for j in range(n)]
      key_data = [np.asarray(k) for k in keys]
    else:
      key_data = [key]
    handles = [Handle(self, request, k) for k in key_data]
    self.waiting.append((prompt, stops, route, handles, images))
    return handles

  def _images(self, request: Request, prompt: np.ndarray):
    """A VL engine's `RowImages` of the request; images refused by a text model's engine."""
    if self.vl is None:
      if len(request.images):
        raise ValueError(f"Request.images: {len(request.images)} image(s) given, but the "
                         f"engine's model has no vision tower (a Qwen2.5-VL model takes them)")
      return None
    return engine_images.prepare(self.vl, prompt, request.images)

  def _check(self, request: Request):
    vocab = self.model.config.vocab_size
    prompt = np.asarray(request.prompt)
    if prompt.ndim != 1 or prompt.size == 0 or not np.issubdtype(prompt.dtype, np.integer):
      raise ValueError(f"Request.prompt must be a non-empty sequence of token ids, got "
                       f"{request.prompt!r:.80}")
    bad = prompt[(prompt < 0) | (prompt >= vocab)]
    if bad.size:
      raise ValueError(f"Request.prompt: token id {int(bad[0])} is outside the vocabulary "
                       f"[0, {vocab})")
    budget = request.max_new_tokens
    if not isinstance(budget, numbers.Integral) or budget < 1:
      raise ValueError(f"Request.max_new_tokens must be an int >= 1, got {budget!r}")
    total, cap = len(prompt) + budget, self.config.max_len
    if total > cap:
      raise ValueError(f"Request: a prompt of {len(prompt)} tokens plus max_new_tokens {budget} "
                       f"is {total} tokens, more than the engine's capacity of {cap} per row "
                       f"(EngineConfig.max_len)")
    s = request.sampling
    if not isinstance(s, SamplingConfig):
      raise ValueError(f"Request.sampling must be a SamplingConfig, got {s!r}")
    # SamplingConfig checks itself when built; checked again for one built around its checks.
    if not (isinstance(s.temperature, numbers.Real) and math.isfinite(s.temperature)
            and s.temperature >= 0):
      raise ValueError(f"Request.sampling.temperature must be >= 0, got {s.temperature!r}")
    if not (isinstance(s.top_p, numbers.Real) and 0 < s.top_p <= 1):
      raise ValueError(f"Request.sampling.top_p must be in (0, 1], got {s.top_p!r}")
    if not (isinstance(s.top_k, numbers.Integral) and s.top_k >= 0):
      raise ValueError(f"Request.sampling.top_k must be an int >= 0, got {s.top_k!r}")
    stops = np.asarray(self.model.stop_ids if request.stop_ids is None else request.stop_ids,
                       np.int64).reshape(-1)
    bad = stops[(stops < 0) | (stops >= vocab)]
    if bad.size:
      raise ValueError(f"Request.stop_ids: {int(bad[0])} is outside the vocabulary [0, {vocab})")
    route = None
    if request.route is not None:
      if self.adapter is None:
        raise ValueError("Request.route is given but the engine has no adapter "
                         "(Engine(..., adapter=))")
      leaves = [np.asarray(a) for a in jax.tree.leaves(request.route)]
      want = [(a.shape, a.dtype) for a in self._route_template]
      if [(a.shape, a.dtype) for a in leaves] != want:
        raise ValueError(f"Request.route: leaves {[(a.shape, str(a.dtype)) for a in leaves]} "
                         f"are not one row of the engine adapter's "
                         f"{[(s_, str(d)) for s_, d in want]}")
      route = leaves
    elif self.adapter is not None:
      raise ValueError("Request.route is None but the engine runs an adapter: give each "
                       "request its row (`routes_of(adapter)`)")
    key = jax.random.key(0) if request.rng is None else request.rng
    if not jnp.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))
    if key.shape != ():
      raise ValueError(f"Request.rng must be one PRNG key, got shape {key.shape}")
    return prompt.astype(np.int32), stops.astype(np.int32), route, np.asarray(
        jax.random.key_data(key))

  # -- the loop -----------------------------------------------------------------------------

  @property
  def busy(self) -> bool:
    return bool(self.waiting) or any(r is not None for r in self.slots)

  def step(self) -> bool:
    """One round: admit, prefill a chunk, decode `steps_per_call` tokens. Whether work remains."""
    self._drop_cancelled()
    self._admit()
    prefill_rows = self._prefill_queue()[:self.config.prefill_rows]
    if prefill_rows:
      self._guarded(prefill_rows, self._prefill, prefill_rows)
    live = self._rows("decode")
    if live:
      self._guarded(live, self._decode, live)
    return self.busy

  def run(self) -> None:
    """Steps until every submitted request is done."""
    while self.step():
      pass

  def generate(self, prompts: Sequence[Sequence[int]], settings: GenerationSettings, *,
               rng: jax.Array, routes: Sequence | None = None, row_keys=None,
               images: Sequence[Sequence[np.ndarray]] | None = None) -> SampleOutput:
    """`sampling.sample`'s call on the engine: same settings, rows, keys (row i draws with
    fold_in(rng, i) or row_keys[i]) and output layout (pad_id after the end); `images`: each
    prompt's (a VL engine's), as `vl_sampling.sample` takes them. Runs of
    `settings.prompt_repeats` rows (equal prompts and routes, as `sample` checks them) are one
    group each: they share their prompt's pages."""
    r = settings.prompt_repeats
    rows = None if routes is None else jax.tree.map(lambda *xs: np.stack(xs), *routes)
    check_runs(prompts, rows, r, "Engine.generate")  # every run before any row is submitted
    handles = []
    for i in range(0, len(prompts), r):
      keys = [jax.random.fold_in(rng, j) if row_keys is None else row_keys[j]
              for j in range(i, i + r)]
      request = Request(prompts[i], settings.max_new_tokens, settings.sampling,
                        settings.eos_ids, keys[0], None if routes is None else routes[i],
                        () if images is None else images[i])
      handles += self.submit_group(request, r, keys) if r > 1 else [self.submit(request)]
    self.run()
    n, new = len(prompts), settings.max_new_tokens
    tokens = np.full((n, new), settings.pad_id, np.int32)
    logprobs = np.zeros((n, new), np.float32)
    lengths = np.zeros((n,), np.int32)
    for i, h in enumerate(handles):
      c = h.result()
      tokens[i, :len(c.tokens)], logprobs[i, :len(c.tokens)] = c.tokens, c.logprobs
      lengths[i] = len(c.tokens)
    return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths)

  def set_adapter(self, adapter) -> None:
    """New adapter weights between runs (a trainer's experts after an update): the pages and
    the compiled programs stay. Refused while requests are in the engine, or for an adapter
    whose rows differ in shape from the engine's (a program of its own: another engine)."""
    if self.busy:
      raise RuntimeError("Engine.set_adapter: requests are waiting or live; finish them first")
    if (adapter is None) != (self.adapter is None):
      raise ValueError("Engine.set_adapter: an engine built without an adapter takes none, and "
                       "one built with an adapter needs one")
    if adapter is not None:
      rows = [(np.asarray(a)[0].shape, np.asarray(a).dtype)
              for a in jax.tree.leaves(adapter.row_data)]
      want = [(a.shape, a.dtype) for a in self._route_template]
      if rows != want:
        raise ValueError(f"Engine.set_adapter: rows of {rows}, the engine's are {want}")
      if getattr(adapter, "kernel", None) == "merged":
        adapter = dataclasses.replace(adapter, kernel="auto")
    if self.prefix is not None:
      self.prefix.clear()  # cached k / v came from the old weights
    self.adapter = adapter

  # -- accounting ---------------------------------------------------------------------------

  def kv_usage(self) -> dict:
    """Pages held against tokens live (a shared prompt page counted once)."""
    rows = [r for r in self.slots if r is not None]
    refs = self.pages.refcount.copy()
    if self.prefix is not None:
      refs[self.prefix.held()] -= 1  # the cache's own reference: not a row's
    shared = int(np.maximum(refs - 1, 0).sum())
    tokens = sum(r.length for r in rows) - shared * self.config.page_size
    per_page = paged.page_bytes(self.model.config, self.config.page_size, self.pool.k[0].dtype)
    cached = 0 if self.prefix is None else self.prefix.cached_only()
    return {"rows": len(rows), "pages_held": self.pages.used, "pages_cached_only": cached,
            "slots_held": self.pages.used * self.config.page_size, "tokens_live": tokens,
            "bytes_held": self.pages.used * per_page, "bytes_live": tokens * per_page
            // self.config.page_size}

  # -- internals ----------------------------------------------------------------------------

  def _rows(self, state: str) -> list[_Row]:
    rows = [r for r in self.slots if r is not None and r.state == state]
    return sorted(rows, key=lambda r: r.order)

  def _prefill_queue(self) -> list[_Row]:
    """Rows waiting for prefill, in `EngineConfig.prefill_order`."""
    rows = self._rows("prefill")
    if self.config.prefill_order == "longest":
      rows.sort(key=lambda r: -r.budget)  # stable: admission order among equal budgets
    return rows

  def _admit(self) -> None:
    psize = self.config.page_size
    while self.waiting:
      prompt, stops, route, handles, images = self.waiting[0]
      free = [i for i, r in enumerate(self.slots) if r is None]
      n = len(handles)
      if len(free) < n:
        return
      root = None if self.prefix is None or images is not None else root_of(route)
      # The cached run of the prompt's full pages, its last token always left to prefill.
      keys = [] if root is None else self.prefix.keys(root, prompt, (len(prompt) - 1) // psize)
      cached = self.prefix.match(keys) if keys else []
      worst = self.pages.pages_for(len(prompt) + handles[0].request.max_new_tokens)
      shared = len(prompt) // psize if n > 1 else 0
      need = worst - len(cached) + (n - 1) * (worst - shared)
      if need > self.pages.available and self.prefix is not None:
        self.prefix.evict(need - self.pages.available)
      if need > self.pages.available:
        self.pages.release(cached)
        return
      self.waiting.popleft()
      self.pages.reserve(need)
      if root is not None:
        self.stats["prefix_pages_asked"] += len(keys)
        self.stats["prefix_pages_hit"] += len(cached)
      rows = []
      for j, (slot, handle) in enumerate(zip(free, handles)):
        row = _Row(handle, prompt, stops, route,
                   worst - len(cached) if j == 0 else worst - shared, self._admitted, images,
                   root, keys, "prefill" if j == 0 else "wait")
        self._admitted += 1
        self.slots[slot] = row
        rows.append(row)
      rows[0].pages = cached
      rows[0].prefilled = rows[0].length = len(cached) * psize
      rows[0].members = rows[1:]

  def _drop_cancelled(self) -> None:
    for entry in list(self.waiting):
      for h in entry[3]:
        if h._cancelled and not h.done:
          h.finish_reason = "cancelled"
      if all(h.done for h in entry[3]):
        self.waiting.remove(entry)
    for row in list(self.slots):
      if row is not None and row.handle._cancelled and row.state != "wait":
        self._finish(row, "cancelled")

  def _finish(self, row: _Row, reason: str, error: Exception | None = None) -> None:
    """Ends a row: handle told, pages released, reservation returned, slot freed. A leader
    that ends before its prompt is done takes its waiting members with it."""
    if not row.handle.done:
      row.handle.finish_reason, row.handle.error = reason, error
    if row.root is not None and reason in ("stop", "length"):
      # The full pages it wrote (prompt and reply): the start of a next turn's prompt.
      tokens = np.concatenate([row.prompt, np.asarray(row.handle.tokens, np.int32)])
      full = min(row.length, len(tokens)) // self.config.page_size
      keys = self.prefix.keys(row.root, tokens, full, known=row.prompt_keys)
      self.prefix.insert(keys, row.pages[:full])
    self.pages.release(row.pages)
    self.pages.unreserve(row.reserved)
    row.pages, row.reserved = [], 0
    self.slots[self.slots.index(row)] = None
    if row.state != "decode":
      for member in row.members:
        if member in self.slots:
          self._finish(member, reason, error)

  def _guarded(self, rows: list[_Row], call, *args) -> None:
    """Runs a device call; if it raises, the rows it carried fail with the error."""
    try:
      call(*args)
    except Exception as e:  # noqa: BLE001 - the error goes to the requests it concerns
      err = EngineError(f"{call.__name__.strip('_')} failed for {len(rows)} rows: {e!r}")
      err.__cause__ = e
      for row in rows:
        if row in self.slots:
          self._finish(row, "error", err)

  def _grow(self, row: _Row, tokens: int) -> None:
    """Pages for the row's first `tokens` positions (from its reservation)."""
    need = self.pages.pages_for(tokens) - len(row.pages)
    if need > 0:
      row.pages += self.pages.allocate(need)
      row.reserved -= need

  def _table(self, rows: list[_Row], r: int) -> np.ndarray:
    table = np.full((r, self.config.pages_per_row), TRASH_PAGE, np.int32)
    for i, row in enumerate(rows):
      table[i, :len(row.pages)] = row.pages
    return table

  def _slot_index(self, rows: list[_Row], r: int) -> np.ndarray:
    idx = np.full((r,), self.config.slots, np.int32)  # past the slots: writes dropped
    idx[:len(rows)] = [self.slots.index(row) for row in rows]
    return idx

  def _adapter_for(self, rows: list[_Row], r: int):
    """The engine adapter with these rows' routes (padding rows: zeros, adding nothing)."""
    if self.adapter is None:
      return None
    leaves = []
    for k, template in enumerate(self._route_template):
      batch = np.zeros((r,) + template.shape, template.dtype)
      for i, row in enumerate(rows):
        batch[i] = row.route[k]
      leaves.append(jnp.asarray(batch))
    it = iter(leaves)
    return self.adapter.map_rows(lambda _: next(it))

  def _prefill(self, rows: list[_Row]) -> None:
    cfg = self.config
    r = bucket(len(rows), minimum=cfg.min_prefill_rows)
    chunks = [min(cfg.prefill_chunk, len(row.prompt) - row.prefilled) for row in rows]
    # Two chunk lengths only (a prompt's tail, the rest): each is one more compiled program.
    short = max(1, cfg.prefill_chunk // 4)
    t = short if max(chunks) <= short else cfg.prefill_chunk
    tokens = np.zeros((r, t), np.int32)
    start, count, last = (np.zeros((r,), np.int32) for _ in range(3))
    last = last.astype(bool)
    for i, (row, c) in enumerate(zip(rows, chunks)):
      self._grow(row, row.prefilled + c)
      tokens[i, :c] = row.prompt[row.prefilled:row.prefilled + c]
      start[i], count[i] = row.prefilled, c
      last[i] = row.prefilled + c == len(row.prompt)
    self.pool, self.pending = engine_steps.prefill(
        self.model.params, self.fused, self._adapter_for(rows, r), self.pool, self.pending,
        self._slot_index(rows, r), tokens, PagedRows(self._table(rows, r), start, count), last,
        *self._image_chunk(rows, chunks, r, t), embed_bits=self.embed_bits,
        config=self.model.config, block_pages=cfg.block_pages)
    self.stats["prefill_calls"] += 1
    self.stats["prefill_computed"] += r * t
    self.stats["prefill_tokens"] += sum(chunks)
    for row, c, is_last in zip(rows, chunks, last):
      row.prefilled += c
      row.length = row.prefilled
      if is_last:
        row.state = "decode"
        if row.members:
          self._fork(row)

  def _image_chunk(self, rows: list[_Row], chunks: list[int], r: int, t: int) -> tuple:
    """A VL engine's (rope, image) for the chunk (the tower run for rows starting); ()."""
    if self.vl is None:
      return ()
    for row in rows:
      engine_images.ensure_features(self.vl, row.images)
    return engine_images.chunk_inputs(
        [(row.images, row.prefilled, c) for row, c in zip(rows, chunks)], r, t,
        self.model.config.hidden_size)

  def _fork(self, leader: _Row) -> None:
    """The leader's prompt into its members' tables: full pages shared, the last one copied."""
    psize, s = self.config.page_size, self.config.slots
    full = len(leader.prompt) // psize
    src_pages, dst_pages, src_slots, dst_slots = [], [], [], []
    for member in leader.members:
      shared = leader.pages[:full]
      self.pages.retain(shared)
      member.pages = list(shared)
      if len(leader.prompt) % psize:
        self._grow(member, len(leader.prompt))
        src_pages.append(leader.pages[full])
        dst_pages.append(member.pages[full])
      src_slots.append(self.slots.index(leader))
      dst_slots.append(self.slots.index(member))
      member.prefilled = member.length = len(leader.prompt)
      member.state = "decode"
    pad = lambda xs, fill: np.asarray(xs + [fill] * (s - len(xs)), np.int32)
    self.pool, self.pending = engine_steps.fork(
        self.pool, self.pending, pad(src_pages, self.pages.num_pages),
        pad(dst_pages, self.pages.num_pages), pad(src_slots, s), pad(dst_slots, s))

  def _decode_rows(self, live: int) -> int:
    """The rows of the decode program for `live` rows (see `EngineConfig.decode_row_step`)."""
    cfg = self.config
    r = bucket(live, minimum=cfg.min_decode_rows)
    if cfg.decode_row_step and live > cfg.min_decode_rows:
      r = -(-live // cfg.decode_row_step) * cfg.decode_row_step
    return min(r, bucket(cfg.slots, minimum=1))

  def _decode(self, rows: list[_Row]) -> None:
    cfg = self.config
    r = self._decode_rows(len(rows))
    n_stops = max(1, max(len(row.stops) for row in rows))
    stops = np.full((r, n_stops), -1, np.int32)
    keys = np.zeros((r,) + rows[0].handle.key_data.shape, np.uint32)
    temperature, top_p = np.zeros((r,), np.float32), np.ones((r,), np.float32)
    top_k, budget, length, generated = (np.zeros((r,), np.int32) for _ in range(4))
    active = np.arange(r) < len(rows)
    for i, row in enumerate(rows):
      # Pages for the tokens this call may write (the last one of a row is never written).
      self._grow(row, min(row.length + cfg.steps_per_call, len(row.prompt) + row.budget - 1))
      s = row.handle.request.sampling
      stops[i, :len(row.stops)] = row.stops
      keys[i] = row.handle.key_data
      temperature[i], top_p[i], top_k[i] = s.temperature, s.top_p, s.top_k
      budget[i], length[i], generated[i] = row.budget, row.length, row.generated
    # Host arrays go to the program as they are (keys as their data, wrapped inside it): a
    # jnp.asarray per array compiled a small program per shape.
    settings = engine_steps.RowSettings(keys, temperature, top_p, top_k, stops, budget)
    offset = None
    if self.vl is not None:
      offset = np.zeros((r,), np.int32)
      offset[:len(rows)] = [row.images.delta for row in rows]
    self.pool, self.pending, out = engine_steps.decode(
        self.model.params, self.fused, self._adapter_for(rows, r), self.pool, self.pending,
        self._slot_index(rows, r), active, self._table(rows, r), length, generated, settings,
        offset, self.embed_bits, config=self.model.config, steps=cfg.steps_per_call,
        block_pages=cfg.block_pages)
    out = jax.device_get(out)
    emitted = (out.tokens >= 0).sum(axis=1)
    self.stats["decode_calls"] += 1
    self.stats["decode_computed"] += r * int(emitted.max())
    self.stats["decode_tokens"] += int(emitted.sum())
    for i, row in enumerate(rows):
      n = int(emitted[i])
      toks, logps = out.tokens[i, :n].tolist(), out.logprobs[i, :n].tolist()
      row.handle.tokens += toks
      row.handle.logprobs += logps
      row.generated, row.length = int(out.generated[i]), int(out.length[i])
      if not np.all(np.isfinite(logps)):
        self._finish(row, "error", EngineError(
            f"request of {len(row.prompt)} prompt tokens: a non-finite log-prob at generated "
            f"token {row.generated - n + int(np.argmin(np.isfinite(logps)))}"))
      elif out.done[i]:
        self._finish(row, "stop" if toks and toks[-1] in row.stops else "length")


def config_for_rows(prompts: Sequence[Sequence[int]], max_new_tokens: int, max_positions: int,
                    page_size: int = 16) -> EngineConfig:
  """An engine for one `generate` call of these rows: a slot per row, each as long as the
  longest row needs (rounded up to a page, at most `max_positions`)."""
  longest = max(map(len, prompts)) + max_new_tokens
  return EngineConfig(slots=len(prompts), page_size=page_size,
                      max_len=min(-(-longest // page_size) * page_size, max_positions))


def routes_of(adapter) -> list:
  """Each row of `adapter.row_data` as one request's `route` (the per-row mixture `sample`
  takes as one adapter, split by row)."""
  leaves, treedef = jax.tree.flatten(adapter.row_data)
  n = np.asarray(leaves[0]).shape[0]
  return [jax.tree.unflatten(treedef, [np.asarray(a)[i] for a in leaves]) for i in range(n)]
