"""A scripted backbone for the baseline systems: replies chosen by a function of the ask, every
ask and every round recorded."""

from __future__ import annotations

from morse_jax.baselines.flow import Answer

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
BAD = "```python\ndef add(a, b):\n    return a - b\n```"


class Scripted:
  def __init__(self, respond):
    self.respond, self.asks, self.replies, self.rounds = respond, [], [], []

  def __call__(self, asks, keys=None):
    texts = [self.respond(a) for a in asks]
    self.asks += asks
    self.replies += texts
    self.rounds.append(len(asks))
    return [Answer(text, len(str(a.messages).split()), len(text.split()), False)
            for a, text in zip(asks, texts)]

  def reply_to(self, phase, holding):
    """The reply to the one ask of `phase` whose last message holds `holding`."""
    [reply] = [r for a, r in zip(self.asks, self.replies)
               if a.phase == phase and holding in a.messages[-1]["content"]]
    return reply

  def phases(self):
    return [a.phase for a in self.asks]

  def prompts(self, phase):
    return [a.messages[-1]["content"] for a in self.asks if a.phase == phase]
