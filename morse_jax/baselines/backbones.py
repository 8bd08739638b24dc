"""The frozen backbone the baselines' calls run on (`flow.Backbone`), no adapter, each call with
its own key (`flow.ask_key`):

  EngineBackbone  each ask a request on one generation engine, submitted when its flow yields it:
                  a task's next call prefills and decodes beside another task's long reply, and
                  a row costs the steps it lives (issue 55), not its round's longest row's
  static_chat     a `Chat` for `flow.Rounds`: the round's asks in one static sampler call per
                  temperature (on a mesh of several devices, where the engine does not shard)

Both draw a sampled call with its key alone (the engine's rows are keyed as `llm.sample`'s
row_keys), so the two give the same replies; tests/baselines/test_backbones.py checks it.
"""

from __future__ import annotations

import logging
from typing import Sequence

import jax
import jax.numpy as jnp

from morse_jax import llm
from morse_jax.baselines.flow import Answer, Ask, Chat, Pending
from morse_jax.llm.engine import Engine, EngineConfig, Request
from morse_jax.mas.agents import Agents
from morse_jax.mas.engine_run import PAGE_SIZE

log = logging.getLogger(__name__)
ROW_PROMPT = 4096  # prompt tokens an engine row holds beside the budget (longer: static sampler)


def sampling_of(ask: Ask) -> llm.SamplingConfig:
  return llm.SamplingConfig(temperature=ask.temperature) if ask.temperature else llm.GREEDY


def static_chat(agents: Agents) -> Chat:
  """The round's asks on the static sampler: one call per temperature (greedy rows together, as
  `single`), row i drawing with its ask's key."""

  def chat(asks: Sequence[Ask], keys: Sequence[jax.Array]) -> list[Answer]:
    out: list[Answer | None] = [None] * len(asks)
    for temperature in sorted({a.temperature for a in asks}):
      rows = [i for i, a in enumerate(asks) if a.temperature == temperature]
      prompts = [agents.tokens(asks[i].messages) for i in rows]
      replies = agents.replies(prompts, None, rng=keys[rows[0]],
                               sampling=sampling_of(asks[rows[0]]),
                               row_keys=jnp.stack([keys[i] for i in rows]))
      for i, p, r in zip(rows, prompts, replies):
        out[i] = Answer(r.text, len(p), r.tokens, r.cut)
    return out

  return chat


class EngineBackbone:
  """The asks on one `Engine` for the batch. Sized at the first step by the asks submitted before
  it (the first round: every task's first calls): that many slots, rows of `ROW_PROMPT` prompt
  tokens plus the budget (within the model's positions), a pool for every slot at a typical
  `ROW_PROMPT / 2` tokens plus one full row (admission waits for pages beyond). A call whose
  prompt does not fit a row, or that the engine failed, runs alone on the static sampler with
  its key, logged and counted (`fallbacks`)."""

  def __init__(self, agents: Agents):
    self.agents, self.limit = agents, agents.max_new_tokens
    self.engine: Engine | None = None
    self.queued: list[tuple[Pending, list[int]]] = []  # before the first step
    self.live: dict[object, tuple[Pending, list[int]]] = {}  # handle -> (ask, prompt)
    self.fallbacks = 0

  def submit(self, ask: Ask, key: jax.Array) -> Pending:
    pending = Pending(ask, key)
    prompt = self.agents.tokens(ask.messages)
    if self.engine is None:
      self.queued.append((pending, prompt))
    else:
      self._submit(pending, prompt)
    return pending

  def step(self) -> None:
    if self.engine is None:
      self.engine = self._build(max(1, len(self.queued)))
      queued, self.queued = self.queued, []
      for pending, prompt in queued:
        self._submit(pending, prompt)
    if not self.live:
      return
    self.engine.step()
    for handle, (pending, prompt) in [(h, c) for h, c in self.live.items() if h.done]:
      del self.live[handle]
      if handle.error is not None:
        self._static(pending, prompt, f"the engine failed it: {handle.error}")
      else:
        reply = self.agents.reply(handle.result().tokens, self.limit)
        pending.answer = Answer(reply.text, len(prompt), reply.tokens, reply.cut)

  def _build(self, slots: int) -> Engine:
    positions = self.agents.model.config.max_position_embeddings
    pages = lambda tokens: -(-tokens // PAGE_SIZE)
    max_len = min(pages(ROW_PROMPT + self.limit) * PAGE_SIZE, positions)
    typical = min(ROW_PROMPT // 2 + self.limit, max_len)
    # Chunks of 512 prompt tokens: a baseline's calls start one by one (each when its flow's last
    # answer came), so a chunk is mostly one row's; Qwen2.5-Coder-1.5B prefilled a 1504-token
    # prompt alone at 71 tokens/s in chunks of 512, 56 in the default 128 (bf16, this CPU).
    config = EngineConfig(slots=slots, max_len=max_len, page_size=PAGE_SIZE, prefill_chunk=512,
                          num_pages=slots * pages(typical) + pages(max_len) + 1)  # + trash page
    return Engine(self.agents.model, config)

  def _submit(self, pending: Pending, prompt: list[int]) -> None:
    if len(prompt) + self.limit > self.engine.config.max_len:
      return self._static(pending, prompt, f"{len(prompt)} prompt tokens + the budget "
                          f"{self.limit} exceed the engine's rows of {self.engine.config.max_len}")
    # stop_ids None: the model's, as the static sampler stops
    request = Request(prompt, self.limit, sampling_of(pending.ask), rng=pending.key)
    self.live[self.engine.submit(request)] = (pending, prompt)

  def _static(self, pending: Pending, prompt: list[int], why: str) -> None:
    self.fallbacks += 1
    log.warning("baseline on the engine: a %s call of %d prompt tokens goes to the static "
                "sampler: %s", pending.ask.phase, len(prompt), why)
    [pending.answer] = static_chat(self.agents)([pending.ask], [pending.key])
