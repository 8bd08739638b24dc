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
`fallbacks`).
"""

from __future__ import annotations

import logging
from typing import Sequence

import jax

from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, EngineError, routes_of
from morse_jax.llm.sampling import bucket

log = logging.getLogger(__name__)
PAGE_SIZE = 16
MIN_LEN = 256  # the shortest row capacity built: fewer rebuilds while prompts grow


class EngineSampler:
  """`llm.sample`'s signature (model, prompts, settings, rng=, mesh=, adapter=) on one engine
  kept between calls; see the module docstring."""

  def __init__(self, model: llm.Model):
    self.model = model
    self.engine: Engine | None = None
    self.fallbacks = 0
    self.builds = 0

  def __call__(self, model: llm.Model, prompts: Sequence[Sequence[int]],
               settings: llm.GenerationSettings, *, rng: jax.Array, mesh=None,
               adapter=None) -> llm.SampleOutput:
    if model is not self.model:
      raise ValueError("EngineSampler: called with another model than the one it was built for")
    need = max(map(len, prompts)) + settings.max_new_tokens
    engine = self._engine_for(len(prompts), need, adapter)
    try:
      return engine.generate(prompts, settings, rng=rng,
                             routes=None if adapter is None else routes_of(adapter))
    except EngineError as e:
      self.engine = None  # its state is not to be trusted after a failed device call
      return self._static(prompts, settings, rng, mesh, adapter, f"the engine failed: {e}")

  def _engine_for(self, rows: int, need: int, adapter) -> Engine:
    """The kept engine with `adapter`, or a larger one when it cannot hold the call."""
    engine, slots = self.engine, bucket(rows, minimum=1)
    max_len = min(bucket(need, MIN_LEN), self.model.config.max_position_embeddings)
    if engine is not None and engine.config.slots >= slots and engine.config.max_len >= need:
      try:
        engine.set_adapter(adapter)
        return engine
      except ValueError as e:  # another adapter layout: another engine
        log.info("rollout engine rebuilt: %s", e)
    if engine is not None:
      slots, max_len = max(slots, engine.config.slots), max(max_len, engine.config.max_len)
    self.engine = Engine(self.model, EngineConfig(slots=slots, max_len=max_len,
                                                  page_size=PAGE_SIZE), adapter=adapter)
    self.builds += 1
    return self.engine

  def _static(self, prompts, settings, rng, mesh, adapter, why: str) -> llm.SampleOutput:
    self.fallbacks += 1
    log.warning("rollout of %d rows on the static sampler: %s", len(prompts), why)
    return llm.sample(self.model, list(prompts), settings, rng=rng, mesh=mesh, adapter=adapter)
