"""The baselines' backbones: on a tiny random model the generation engine answers every call
(greedy and sampled) as the static sampler in rounds does; a call too long for the engine's rows
runs on the static sampler, counted; `drive` resumes a flow as soon as its own calls are
answered (no round barrier) and keys a call by its task, not its batch position."""

from __future__ import annotations

import jax
import pytest

from morse_jax import llm
from morse_jax.baselines import backbones
from morse_jax.baselines.flow import Answer, Ask, Pending, Rounds, Task, ask_key, drive
from morse_jax.mas.agents import Agents
from morse_jax.tasks.base import Problem
from tests import tiny_models


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
  folder, _ = tiny_models.save_hf_model("llama", str(tmp_path_factory.mktemp("backbones")))
  return Agents(model=llm.load(folder), lora=None, router=None, embed=None, max_new_tokens=6)


def words_flow(words: str, sampled: bool):
  """Two rounds: one greedy ask, then two (one sampled when `sampled`) that quote the reply."""
  first = yield [Ask("first", [{"role": "user", "content": words}])]
  both = yield [Ask("again", [{"role": "user", "content": f"{words} {first[0]}"}]),
                Ask("draw", [{"role": "user", "content": f"w5 {first[0]}"}], 0.9 if sampled else 0)]
  return " | ".join(first + both)


def tasks(n):
  return [Task(Problem(f"p{i}", "words", "c", ""), None) for i in range(n)]


def run(backbone, statements=("w40 w41", "w42", "w43 w44 w45 w46 w47")):
  batch = tasks(len(statements))
  finals = drive([words_flow(s, sampled=i != 1) for i, s in enumerate(statements)], batch,
                 backbone, jax.random.key(3))
  return finals, [[(c.phase, c.prompt_tokens, c.generated_tokens, c.cut) for c in t.calls]
                  for t in batch]


@pytest.mark.slow  # ~25 s: the static sampler's and the engine's programs for a tiny model
def test_the_engine_answers_as_the_static_sampler_and_falls_back_for_long_calls(agents,
                                                                                monkeypatch):
  static = run(Rounds(backbones.static_chat(agents)))
  engine = backbones.EngineBackbone(agents)
  assert run(engine) == static and engine.fallbacks == 0
  assert engine.engine.config.slots == 3  # the first round: one ask per task
  # rows of one page (16 tokens): a call whose prompt and budget (6) exceed it runs alone on the
  # static sampler, the others on the engine
  monkeypatch.setattr(backbones, "ROW_PROMPT", 1)
  short = backbones.EngineBackbone(agents)
  long_calls = sum(prompt + 6 > 16 for calls in static[1] for _, prompt, _, _ in calls)
  assert 0 < long_calls < 9
  assert run(short) == static and short.fallbacks == long_calls


class Delayed:
  """A backbone whose ask is answered after as many steps as its task's number + 1."""

  def __init__(self):
    self.steps, self.log = 0, []

  def submit(self, ask, key):
    pending = Pending(ask, key)
    pending.due = self.steps + 1 + int(ask.messages[0]["content"])
    self.log.append(("submit", ask.messages[0]["content"], ask.phase, self.steps))
    self.pending = getattr(self, "pending", []) + [pending]
    return pending

  def step(self):
    self.steps += 1
    for p in self.pending:
      if p.answer is None and p.due <= self.steps:
        p.answer = Answer(f"{p.ask.phase} done", 1, 1, False)


def three_calls(task: str):
  for phase in ("one", "two", "three"):
    yield [Ask(phase, [{"role": "user", "content": task}])]
  return "end"


def test_a_flow_moves_on_as_soon_as_its_own_calls_are_answered():
  backbone = Delayed()
  finals = drive([three_calls("0"), three_calls("4")], tasks(2), backbone)
  assert finals == ["end", "end"]
  # task 0 (one step a call) makes its three calls while task 1 (five steps) waits for its first
  assert [(t, phase, step) for _, t, phase, step in backbone.log] == [
      ("0", "one", 0), ("4", "one", 0), ("0", "two", 1), ("0", "three", 2), ("4", "two", 5),
      ("4", "three", 10)]


def test_a_call_is_keyed_by_its_task_and_number_not_its_batch_position():
  keys = {}

  def chat(asks, ks):
    for a, k in zip(asks, ks):
      keys[a.messages[0]["content"], a.phase] = jax.random.key_data(k).tolist()
    return [Answer("", 1, 1, False) for _ in asks]

  batch = [Task(Problem(f"id{i}", "words", "c", ""), None) for i in (7, 8)]
  drive([three_calls("a"), three_calls("b")], batch, chat, jax.random.key(1))
  both, keys = dict(keys), {}  # the closure sees the new dict
  drive([three_calls("b")], batch[1:], chat, jax.random.key(1))
  alone = keys
  assert {k: v for k, v in both.items() if k[0] == "b"} == alone  # the same draws alone
  assert both["b", "two"] == jax.random.key_data(
      ask_key(jax.random.key(1), "id8", 1)).tolist() != both["a", "two"]
