"""A scripted chat backend: replies chosen by a function of the prompt, calls recorded."""

from __future__ import annotations

from typing import Callable

from apex_jax.judges.chat import JudgeError


class ScriptedChat:
  """reply(prompt_text) -> str, or a JudgeError to return for that conversation.

  Has `complete_many`, so the judges batch through it; `calls` records (rows, max_tokens,
  temperature) per call."""

  def __init__(self, reply: Callable[[str], str | JudgeError]):
    self.reply = reply
    self.calls: list[tuple[int, int, float]] = []
    self.prompts: list[str] = []

  def complete_many(self, conversations, *, max_tokens, temperature):
    self.calls.append((len(conversations), max_tokens, temperature))
    out = []
    for messages in conversations:
      text = messages[-1]["content"]
      self.prompts.append(text)
      out.append(self.reply(text))
    return out

  def complete(self, messages, *, max_tokens, temperature):
    reply = self.complete_many([messages], max_tokens=max_tokens, temperature=temperature)[0]
    if isinstance(reply, JudgeError):
      raise reply
    return reply


def by_role(reasoning, sourcing, validity, arbiter):
  """A reply function for the no-GT judge: one reply per role (each a str or a callable of the
  prompt)."""
  def reply(text: str):
    for marker, value in (("Reasoning and Logical Consistency Evaluator", reasoning),
                          ("Information Sourcing and Credibility Evaluator", sourcing),
                          ("Result Validity Evaluator", validity), ("Final Arbiter", arbiter)):
      if text.split(".")[0].endswith(marker):
        return value(text) if callable(value) else value
    raise AssertionError(f"unexpected prompt {text[:60]!r}")
  return reply
