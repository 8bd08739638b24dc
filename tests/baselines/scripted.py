"""A scripted backbone for the baseline systems: replies chosen by a function of the ask, every
ask and every round recorded."""

from __future__ import annotations

from morse_jax.baselines.flow import Answer

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
BAD = "```python\ndef add(a, b):\n    return a - b\n```"


class Scripted:
  def __init__(self, respond):
    self.respond, self.asks, self.rounds = respond, [], []

  def __call__(self, asks):
    self.asks += asks
    self.rounds.append(len(asks))
    return [Answer(text, len(str(a.messages).split()), len(text.split()), False)
            for a, text in zip(asks, map(self.respond, asks))]

  def phases(self):
    return [a.phase for a in self.asks]

  def prompts(self, phase):
    return [a.messages[-1]["content"] for a in self.asks if a.phase == phase]
