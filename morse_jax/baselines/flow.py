"""What the baseline systems share. A system's flow is a generator, one per task: it yields the
model calls it needs next (`Ask`s, several when they do not depend on each other) and receives
their replies' texts; it returns the final reply, the one the verifier scores. `drive` steps the
flows of a batch of tasks together, so each round is one batched call of the backbone over every
task's asks (as `single` batches its tasks), and records each call (`Call`) on its `Task`.

A reply that does not parse (no code where code is asked for, no verdict where one is asked for)
is a counted, logged fallback (`Task.fallback`), never an error."""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Callable, Generator, Sequence

from morse_jax.execution import verifier
from morse_jax.tasks.base import Problem


@dataclasses.dataclass(frozen=True)
class Ask:
  """One model call: chat messages, the step of the system that asks (records, tests), and the
  sampling temperature (0: greedy, as `single`)."""

  phase: str
  messages: list[dict]
  temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class Answer:
  text: str
  prompt_tokens: int  # chat template included
  generated_tokens: int  # a final stop token included
  cut: bool  # ended by the token limit, not by a stop token


@dataclasses.dataclass(frozen=True)
class Call:
  phase: str
  prompt_tokens: int
  generated_tokens: int
  cut: bool
  prompt: list[dict] | None = None  # the messages, only when the run keeps prompts


Flow = Generator[list[Ask], list[str], str]
Chat = Callable[[Sequence[Ask]], list[Answer]]


def family_tester(family: Any, problem: Problem, code: str) -> tuple[bool, str]:
  """(passed, report) of code on what a system may test before it answers: the family's
  `run_visible` (HumanEval: the docstring's examples), else the code only executed."""
  run_visible = getattr(family, "run_visible", None)
  if run_visible is not None:
    return run_visible(problem, fence(code))
  run = verifier.run_tests(code, [], timeout_s=30.0)
  return (not run.errors, "; ".join(run.errors)[:1000] or "the code ran without errors")


def fence(code: str) -> str:
  """Code as a reply holds it: one ```python block (what the verifier extracts)."""
  return f"```python\n{code.strip()}\n```\n"


@dataclasses.dataclass
class Task:
  """One task while its flow runs: the problem, the calls made, the fallbacks taken and the
  tester of its code (default `family_tester`)."""

  problem: Problem
  family: Any
  tester: Callable[[str], tuple[bool, str]] | None = None
  calls: list[Call] = dataclasses.field(default_factory=list)
  fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  keep_prompts: bool = False

  @property
  def entry_point(self) -> str | None:
    return self.problem.data.get("entry_point")

  def fallback(self, phase: str, why: str) -> None:
    self.fallbacks[phase] += 1
    logging.warning("baseline: %s, %s: %s (fallback taken)", self.problem.id, phase, why)

  def code_of(self, reply: str) -> str | None:
    """The code of a reply (a fenced block, else plain code that defines the entry point);
    None when it holds none."""
    code = verifier.extract_code(reply, self.entry_point)
    if (code is None or not code.strip()) and self.entry_point:
      code = verifier.unfenced_code(reply, self.entry_point)
    return code if code and code.strip() else None

  def revise(self, phase: str, reply: str, previous: str) -> str:
    """The reply's code, or (a counted fallback) the previous code when it holds none."""
    code = self.code_of(reply)
    if code is None:
      self.fallback(phase, "no code in the reply; the previous code is kept")
      return previous
    return code

  def test(self, code: str) -> tuple[bool, str]:
    if self.tester is not None:
      return self.tester(code)
    return family_tester(self.family, self.problem, code)


def drive(flows: Sequence[Flow], tasks: Sequence[Task], chat: Chat) -> list[str]:
  """Runs the flows to their end, one `chat` call per round over every flow's asks; returns each
  flow's final reply."""
  finals: list[str] = [""] * len(flows)
  pending: dict[int, list[Ask]] = {}

  def advance(i: int, replies: list[str] | None) -> None:
    try:
      asks = flows[i].send(replies)
    except StopIteration as stop:
      finals[i] = stop.value
      return
    if not asks:
      raise ValueError(f"baseline flow of {tasks[i].problem.id} asked for no call")
    pending[i] = list(asks)

  for i in range(len(flows)):
    advance(i, None)
  while pending:
    order, pending = list(pending.items()), {}
    answers = chat([ask for _, asks in order for ask in asks])
    start = 0
    for i, asks in order:
      got = answers[start:start + len(asks)]
      start += len(asks)
      tasks[i].calls += [Call(ask.phase, a.prompt_tokens, a.generated_tokens, a.cut,
                              ask.messages if tasks[i].keep_prompts else None)
                         for ask, a in zip(asks, got)]
      advance(i, [a.text for a in got])
  return finals
