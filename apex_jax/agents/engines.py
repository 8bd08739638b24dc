"""The agents' calls on the generation engine (issue 55): one `llm.engine.Engine` per backbone,
kept for the whole run, so its compiled programs are made once.

A generator holding `AgentEngines` submits each row as its own request with the key the static
sampler would give that row (`generate`: fold_in(rng, i)); the engine's draws depend on the key
alone, so a row samples what `llm.sample` samples. A module's role expert is the row's route on
the engine's adapter; a trainer's new experts replace the adapter between calls (same programs).
The executor submits each episode's next turn as soon as its tool call returns
(`Executor._flow`); planner and distiller calls are a plain batched submit and wait.

Where the engine cannot take a row, the static sampler runs it with its key (logged, counted in
`fallbacks`): a prompt plus budget longer than the engine's rows (`max_len`), or a row the
engine failed. A mesh of several devices keeps the static path (the engine does not shard).
"""

from __future__ import annotations

import logging
from typing import Sequence

import jax
from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, Request, routes_of
from morse_jax.lora.experts import adapter_of
from morse_jax.lora.mixture import uniform_routes

log = logging.getLogger(__name__)
PAGE_SIZE = 16


class Pending:
  """One row's reply to come: an engine handle, or the static sampler's reply (a fallback).
  reply(tokens, logprobs) -> the caller's Generation."""

  def __init__(self, reply, handle=None, generation=None, fallback=None):
    self.reply, self.handle, self._generation, self._fallback = reply, handle, generation, fallback

  @property
  def done(self) -> bool:
    return self.handle is None or self.handle.done

  def result(self):
    """The row's `Generation` (a row the engine failed runs on the static sampler here)."""
    if self._generation is None:
      if self.handle.error is not None:
        log.warning("agents' engine: a row of %d prompt tokens failed (%s); it runs on the "
                    "static sampler", len(self.handle.request.prompt), self.handle.error)
        self._generation = self._fallback()
      else:
        c = self.handle.result()
        self._generation = self.reply(c.tokens, c.logprobs)
    return self._generation


def runs_on_engine(mesh) -> bool:
  """Whether the engine can take a generator's calls: one device (the engine does not shard)."""
  return mesh is None or mesh.size == 1


class AgentEngines:
  """One engine per backbone: `slots` rows decoded together, rows of `max_len` tokens (at most
  the model's positions); `prefix_cache`: each engine keeps finished calls' pages, so a turn
  prefills only what is new since the last (`EngineConfig.prefix_cache`)."""

  def __init__(self, slots: int = 16, max_len: int = 2048, prefix_cache: bool = True):
    for name, value in (("slots", slots), ("max_len", max_len)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"AgentEngines.{name} must be an int >= 1, got {value!r}")
    if not isinstance(prefix_cache, bool):
      raise ValueError(f"AgentEngines.prefix_cache must be a bool, got {prefix_cache!r}")
    self.slots, self.max_len, self.prefix_cache = slots, max_len, prefix_cache
    self._engines: dict[int, tuple] = {}  # id(model) -> (model, engine, experts)
    self.fallbacks = 0

  def engine(self, model: llm.Model, experts, lora, kernel: str) -> Engine:
    """The model's engine, its adapter holding `experts` (None: the bare backbone)."""
    entry = self._engines.get(id(model))
    adapter = None
    if experts is not None:
      roles = [[k] for k in range(lora.num_experts)]
      adapter = adapter_of(experts, uniform_routes(roles, 1), lora, model.config,
                           "auto" if kernel == "merged" else kernel)
    if entry is None:
      max_len = min(self.max_len, model.config.max_position_embeddings)
      config = EngineConfig(slots=self.slots, max_len=max_len, page_size=PAGE_SIZE,
                            prefix_cache=self.prefix_cache)
      entry = (model, Engine(model, config, adapter=adapter), experts)
    elif entry[2] is not experts:
      entry[1].set_adapter(adapter)
      entry = (model, entry[1], experts)
    self._engines[id(model)] = entry
    return entry[1]

  def submit(self, model: llm.Model, prompts: Sequence[Sequence[int]], keys: Sequence,
             max_new_tokens: int, sampling: llm.SamplingConfig, *, experts=None, lora=None,
             role: int = 0, kernel: str = "auto", reply, static) -> list[Pending]:
    """Each prompt as one request drawing with its key; reply(tokens, logprobs) -> the
    Generation of a row; static(prompt, key) -> Generation runs a row the engine cannot take."""
    engine = self.engine(model, experts, lora, kernel)
    route = None if experts is None else routes_of(engine.adapter)[role]
    settings = llm.GenerationSettings.for_model(model, max_new_tokens, sampling)
    out = []
    for prompt, key in zip(prompts, keys):
      rerun = lambda prompt=prompt, key=key: self._static(static, prompt, key)
      if len(prompt) + max_new_tokens > engine.config.max_len:
        log.warning("agents' engine: a prompt of %d tokens plus %d new is longer than its rows "
                    "(%d); it runs on the static sampler", len(prompt), max_new_tokens,
                    engine.config.max_len)
        out.append(Pending(reply, generation=rerun()))
        continue
      handle = engine.submit(Request(list(prompt), max_new_tokens, sampling,
                                     settings.eos_ids, key, route))
      out.append(Pending(reply, handle=handle, fallback=rerun))
    return out

  def _static(self, static, prompt, key):
    self.fallbacks += 1
    return static(prompt, key)

  def step(self) -> None:
    """One step of every engine with work."""
    for _, engine, _ in list(self._engines.values()):
      if engine.busy:
        engine.step()

  def wait(self, pending: Sequence[Pending]) -> list:
    """Steps until every row is done; their generations."""
    while not all(p.done for p in pending):
      self.step()
    return [p.result() for p in pending]


def row_keys(rng: jax.Array, n: int) -> list[jax.Array]:
  """The keys `llm.sample` gives rows 0..n-1 of one call: fold_in(rng, i)."""
  return [jax.random.fold_in(rng, i) for i in range(n)]
