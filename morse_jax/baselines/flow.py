"""What the baseline systems share. A system's flow is a generator, one per task: it yields the
model calls it needs next (`Ask`s, several when they do not depend on each other) and receives
their replies' texts; it returns the final reply, the one the verifier scores. `drive` runs the
flows of a batch of tasks on a `Backbone`: a flow's asks are submitted as soon as it yields them
and it resumes as soon as they are answered, so on the generation engine
(`backbones.EngineBackbone`) no task waits for another; on `Rounds` (a `Chat` called once per
step over every ask submitted since the last) the flows move in rounds, each one batched call
over every task's asks (as `single` batches its tasks). Each call is recorded (`Call`) on its
`Task`. Each ask has its own key, fold_in(fold_in(rng, the task's id hash), its call number), so a
sampled call draws the same on either backbone and in any batch.

A reply that does not parse (no code where code is asked for, no verdict where one is asked for)
is a counted, logged fallback (`Task.fallback`), never an error."""

from __future__ import annotations

import collections
import dataclasses
import logging
import zlib
from typing import Any, Callable, Generator, Protocol, Sequence

import jax

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
# One batched call: the asks and their keys in, their answers in the same order out.
Chat = Callable[[Sequence[Ask], Sequence[jax.Array]], list[Answer]]


@dataclasses.dataclass
class Pending:
  """A submitted ask: answered (`answer` set) by a later `Backbone.step`."""

  ask: Ask
  key: jax.Array
  answer: Answer | None = None

  @property
  def done(self) -> bool:
    return self.answer is not None


class Backbone(Protocol):
  def submit(self, ask: Ask, key: jax.Array) -> Pending: ...

  def step(self) -> None: ...


class Rounds:
  """A `Backbone` of rounds: each step answers every ask submitted since the last one by one
  `chat` call (scripted backbones, and the static sampler: `backbones.static_chat`)."""

  def __init__(self, chat: Chat):
    self.chat, self.queue = chat, []

  def submit(self, ask: Ask, key: jax.Array) -> Pending:
    self.queue.append(Pending(ask, key))
    return self.queue[-1]

  def step(self) -> None:
    queue, self.queue = self.queue, []
    if queue:
      for pending, answer in zip(queue, self.chat([p.ask for p in queue], [p.key for p in queue]),
                                 strict=True):
        pending.answer = answer


def ask_key(rng: jax.Array, problem_id: str, call: int) -> jax.Array:
  """The key of a task's call number `call`: its problem's, not its batch position's."""
  task = zlib.crc32(problem_id.encode()) & 0x7FFFFFFF
  return jax.random.fold_in(jax.random.fold_in(rng, task), call)


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


def drive(flows: Sequence[Flow], tasks: Sequence[Task], backbone: Backbone | Chat,
          rng: jax.Array | None = None) -> list[str]:
  """Runs the flows to their end on `backbone` (a bare `Chat` runs in `Rounds`), each flow
  resumed as soon as all of its asks are answered; returns each flow's final reply. rng: the
  asks' keys (`ask_key`; None: key(0))."""
  if not hasattr(backbone, "submit"):
    backbone = Rounds(backbone)
  rng = jax.random.key(0) if rng is None else rng
  finals: list[str] = [""] * len(flows)
  waiting: dict[int, list[Pending]] = {}
  counts = [0] * len(flows)

  def advance(i: int, replies: list[str] | None) -> None:
    try:
      asks = flows[i].send(replies)
    except StopIteration as stop:
      finals[i] = stop.value
      return
    if not asks:
      raise ValueError(f"baseline flow of {tasks[i].problem.id} asked for no call")
    waiting[i] = [backbone.submit(ask, ask_key(rng, tasks[i].problem.id, counts[i] + j))
                  for j, ask in enumerate(asks)]
    counts[i] += len(asks)

  for i in range(len(flows)):
    advance(i, None)
  while waiting:
    backbone.step()
    for i in sorted(i for i, pending in waiting.items() if all(p.done for p in pending)):
      got = waiting.pop(i)
      tasks[i].calls += [Call(p.ask.phase, p.answer.prompt_tokens, p.answer.generated_tokens,
                              p.answer.cut, p.ask.messages if tasks[i].keep_prompts else None)
                         for p in got]
      advance(i, [p.answer.text for p in got])
  return finals
