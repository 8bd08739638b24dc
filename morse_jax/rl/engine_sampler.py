"""Training rollouts on the generation engine (issue 55): `rollout.rollout`'s sampler call.

The static sampler runs a wave's B x M rows as one padded batch until its longest row ends.
Here the rows are requests to one `llm.engine.Engine`: a route's M candidates are one group
(`submit_group`: they share the prompt's pages), each row carries its own mixture of experts
(`Request.route`) and the key the static sampler gives it (fold_in(rng, row)), so the rollout's
tokens and log-probs are the static path's; a row that ends frees its slot and the rows still
running decode in a smaller program. The update stays once per wave: the call returns when the
wave's last row is done.

One engine serves the trainer's life: an update changes only the experts' weights
(`Engine.set_adapter`), so its pages and compiled programs stay. It is rebuilt, larger, when a
wave has more rows or longer rows than it holds (slots and row length grow by powers of two:
few programs; a row longer than the model's positions is refused, as the static sampler
refuses it). A call the engine fails runs on the static sampler instead (logged, counted in
`fallbacks`). The agents' other calls of a training run (a wave's greedy merges,
`Agents.sampler`) go to the same engine, so its programs serve both.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp

from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, EngineError, routes_of
from morse_jax.llm.sampling import bucket
from morse_jax.lora.mixture import Routes

log = logging.getLogger(__name__)
PAGE_SIZE = 16
# The smallest engine built: a rebuild compiles every program again (the pool's shape changes),
# so the first one holds a few waves' rows of a typical length.
MIN_SLOTS, MIN_LEN = 32, 1024
# Few programs, each a compile (seconds on CPU): rows padded to 8 per prefill pass and to 16 per
# decode call cost little at a rollout's sizes, where a step costs about its weight reads.
SIZES = dict(page_size=PAGE_SIZE, prefill_rows=8, min_prefill_rows=8, min_decode_rows=16)


class EngineSampler:
  """`llm.sample`'s signature (model, prompts, settings, rng=, mesh=, adapter=, row_keys=) on
  engines kept between calls (one with an adapter, one for the bare backbone); see the module
  docstring."""

  def __init__(self, model: llm.Model):
    self.model = model
    self.engines: dict[bool, Engine] = {}  # by whether it runs an adapter
    self.fallbacks = 0
    self.builds = 0

  @property
  def engine(self) -> Engine | None:
    """The engine with an adapter (a trainer's)."""
    return self.engines.get(True)

  def __call__(self, model: llm.Model, prompts: Sequence[Sequence[int]],
               settings: llm.GenerationSettings, *, rng: jax.Array, mesh=None, adapter=None,
               row_keys=None) -> llm.SampleOutput:
    if model is not self.model:
      raise ValueError("EngineSampler: called with another model than the one it was built for")
    need = max(map(len, prompts)) + settings.max_new_tokens
    engine, adapter = self._engine_for(len(prompts), need, adapter)
    try:
      return engine.generate(prompts, settings, rng=rng, row_keys=row_keys,
                             routes=None if adapter is None else routes_of(adapter))
    except EngineError as e:
      del self.engines[adapter is not None]  # not to be trusted after a failed device call
      self.fallbacks += 1
      log.warning("rollout of %d rows on the static sampler: the engine failed: %s",
                  len(prompts), e)
      return llm.sample(model, list(prompts), settings, rng=rng, mesh=mesh, adapter=adapter,
                        row_keys=row_keys)

  def _engine_for(self, rows: int, need: int, adapter):
    """(the kept engine, `adapter` in it), or a larger engine when the kept one cannot hold
    the call. Routes are padded with zero weights (adding the same) to every expert's width,
    so a wave's merges (role + the parents' union) and executors (role + top-k) share one."""
    if adapter is not None:
      adapter = widened(adapter, max(adapter.routes.idx.shape[1], experts_of(adapter)))
    engine = self.engines.get(adapter is not None)
    slots = bucket(rows, minimum=MIN_SLOTS)
    max_len = min(bucket(need, MIN_LEN), self.model.config.max_position_embeddings)
    width = 0 if adapter is None else adapter.routes.idx.shape[1]
    if engine is not None:
      held = 0 if adapter is None else engine.adapter.routes.idx.shape[1]
      if engine.config.slots >= slots and engine.config.max_len >= need and held >= width:
        adapter = None if adapter is None else widened(adapter, held)
        try:
          engine.set_adapter(adapter)
          return engine, adapter
        except ValueError as e:  # another layout of the rows: another engine
          log.info("rollout engine rebuilt: %s", e)
      slots, max_len = max(slots, engine.config.slots), max(max_len, engine.config.max_len)
      adapter = None if adapter is None else widened(adapter, max(width, held))
    engine = Engine(self.model, EngineConfig(slots=slots, max_len=max_len, **SIZES),
                    adapter=adapter)
    self.engines[adapter is not None] = engine
    self.builds += 1
    return engine, adapter


def experts_of(adapter) -> int:
  """The experts an adapter holds (K of its [layers, K, d, r] weights)."""
  return next(iter(adapter.experts.values())).a.shape[1]


def widened(adapter, width: int):
  """`adapter` with its routes padded to `width` experts of weight 0."""
  idx, w = adapter.routes.idx, adapter.routes.w
  pad = ((0, 0), (0, width - idx.shape[1]))
  return dataclasses.replace(adapter, routes=Routes(jnp.pad(idx, pad), jnp.pad(w, pad)))
