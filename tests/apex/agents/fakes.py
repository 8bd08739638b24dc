"""Scripted stand-ins for the agents' tests: a generator that replies with canned text, a
searcher over a small dict of passages, and the tiny word-level chat tokenizer."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import numpy as np

from apex_jax.agents.generator import Generation
from apex_jax.tools import Passage, SearchUnavailable
from morse_jax.llm.tokenizer import Tokenizer
from tests import tiny_models

EOS = 1  # "<|end|>" in tests.tiny_models


@functools.lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
  """Shared: building it imports transformers, which takes seconds."""
  return Tokenizer(tiny_models.make_tokenizer(), "tiny")


class ScriptedGenerator:
  """reply(module, prompt_text, call_index, row) -> text, or a dict of per-module lists consumed
  in order per question (keyed by the question's marker found in the prompt)."""

  def __init__(self, reply: Callable[[str, str, int], str], tok: Tokenizer | None = None,
               finished: Callable[[str], bool] = lambda text: True):
    self.tokenizer = tok or tokenizer()
    self.reply, self.finished = reply, finished
    self.calls: list[tuple[str, int]] = []  # (module, rows) per generate call
    self.temperatures: list[float] = []  # per generate call
    self.prompts: list[list[int]] = []

  def tokenizer_of(self, module: str):
    return self.tokenizer

  def generate(self, module, prompts, *, rng, max_new_tokens, sampling):
    self.calls.append((module, len(prompts)))
    self.temperatures.append(sampling.temperature)
    out = []
    for prompt in prompts:
      self.prompts.append(list(prompt))
      text = self.reply(module, self.tokenizer.decode(prompt, skip_special_tokens=False),
                        len(self.calls) - 1)
      finished = self.finished(text)
      ids = self.tokenizer.encode(text) + ([EOS] if finished else [])
      out.append(Generation(np.asarray(ids, np.int32),
                            np.full(len(ids), -0.5, np.float32), text, finished=finished))
    return out


class FakeSearcher:
  """Each query returns `topk` passages whose ids name the query; queries in `fail` raise."""

  def __init__(self, words: int = 5, fail: Sequence[str] = ()):
    self.words, self.fail = words, set(fail)
    self.calls: list[list[str]] = []

  def search(self, queries, topk=None):
    self.calls.append(list(queries))
    bad = [q for q in queries if q in self.fail]
    if bad:
      raise SearchUnavailable(f"server down for {bad[0]!r}")
    k = topk or 3
    return [[Passage(f"{q}#{i}", '"w1"\n' + " ".join(f"w{j % 80 + 5}" for j in range(self.words)))
             for i in range(k)] for q in queries]


def key_number(key) -> int:
  """A key's bits as one number: what a keyed script draws from."""
  return int(np.asarray(jax.random.key_data(key)).astype(np.uint64).sum())


class _Turn:
  """A scripted engine row: done after `steps` engine steps."""

  def __init__(self, generation: Generation, steps: int, name: str):
    self.generation, self.left, self.name = generation, steps, name

  @property
  def done(self) -> bool:
    return self.left <= 0

  def result(self) -> Generation:
    assert self.done, f"{self.name} read before it ended"
    return self.generation


class KeyedEngineGenerator:
  """A generator with both paths: `generate` (the lockstep one: row i draws with fold_in(rng, i))
  and `submit` / `step` (an engine: a row ends `steps(module, prompt)` steps after submission).
  reply(module, prompt_text, number) -> text, number: the key's (`key_number`) when sampled, the
  sum of the prompt ids when greedy (a greedy reply depends on the prompt alone). `events`:
  ("submit" | "done", name) in order, name(prompt_text) naming the row."""

  def __init__(self, reply, steps=lambda module, prompt: 1, name=lambda prompt: "?"):
    self.tokenizer = tokenizer()
    self.reply, self.steps, self.name = reply, steps, name
    self.events: list[tuple[str, str]] = []
    self.live: list[_Turn] = []

  def tokenizer_of(self, module: str):
    return self.tokenizer

  def on_engine(self) -> bool:
    return True

  def _generation(self, module, prompt, key, sampling) -> Generation:
    text = self.reply(module, self.tokenizer.decode(prompt, skip_special_tokens=False),
                      int(sum(prompt)) if sampling.greedy else key_number(key))
    ids = self.tokenizer.encode(text) + [EOS]
    return Generation(np.asarray(ids, np.int32), np.full(len(ids), -0.5, np.float32), text)

  def generate(self, module, prompts, *, rng, max_new_tokens, sampling):
    return [self._generation(module, p, jax.random.fold_in(rng, i), sampling)
            for i, p in enumerate(prompts)]

  def submit(self, module, prompts, *, keys, max_new_tokens, sampling):
    out = []
    for prompt, key in zip(prompts, keys):
      text = self.tokenizer.decode(prompt, skip_special_tokens=False)
      turn = _Turn(self._generation(module, prompt, key, sampling), self.steps(module, text),
                   self.name(text))
      self.events.append(("submit", turn.name))
      self.live.append(turn)
      out.append(turn)
    return out

  def step(self) -> None:
    for turn in self.live:
      turn.left -= 1
      if turn.done:
        self.events.append(("done", turn.name))
    self.live = [t for t in self.live if not t.done]
