"""The comparison systems' episodes over a batch of questions, on APEx's agents, search tool and
memory bank (ECNU-SII/MIA's versions, cited per system):
  react      the executor alone with the search tool (Inference/Base)
  rag        no planner; the top-k correct and top-k incorrect raw trajectories (question, turns,
             answer, judgement) before the executor's question (Inference/Trace with
             Memory-Serve/memory_serve.py `/memory`)
  expel      no planner; the most similar memory's ExpeL rule after the executor's question
             (Inference/Expel with Memory-Serve/Expel.py `/plan`)
  memento    the meta-planner's plan from the top-k correct and top-k incorrect cases (question,
             plan, judgement; cosine alone), then APEx's execute, evaluate, replan
             (Memory-Serve/Memento.py)
  plan_only  the planner without any memory or skill (Memory-Serve/Plan-only.py's plan
             prompt), then APEx's execute, evaluate, replan (Plan-only's mid-run `/guide`, asked
             for by the executor through a memory tool, is not run)
Every memory lives in one bucket, OTHERS, as MIA's servers classify every question "others".
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from apex_jax.agents import Executor, Planner, run_episode
from apex_jax.agents.trajectory import Trajectory
from apex_jax.agents import baseline_prompts as prompts
from apex_jax.baselines.expel import OTHERS, nearest
from apex_jax.memory import MemoryBank
from apex_jax.memory import skills as skills_lib

SYSTEMS = ("react", "rag", "expel", "memento", "plan_only")
MEMORY_SYSTEMS = ("rag", "expel", "memento")  # each builds its own bank first


@dataclasses.dataclass
class Parts:
  """What a system runs on: the generator (its experts set), the searcher, the agents' settings
  and the system's own bank (None for react and plan_only)."""
  generator: object
  searcher: object
  agents: object  # AgentConfig
  bank: MemoryBank | None = None


@dataclasses.dataclass
class Run:
  """One question's run: what its row and its system's memory building read."""
  answer: str | None
  conversations: list[Trajectory]  # every conversation it ran
  turns: list[dict]  # the executor's turns (its last run's)
  memory_text: str | None = None  # the memories or rule its prompt carried
  memory_module: str = "executor"  # whose prompt carried them (its tokenizer counts them)
  shown_ids: tuple[int, ...] = ()  # memories shown (their outcomes are recorded)
  plan: str | None = None  # the first plan (memento, plan_only)


def check_system(name: str) -> str:
  if name not in SYSTEMS:
    raise ValueError(f"baseline system {name!r} not in {SYSTEMS}")
  return name


def run_system(name: str, parts: Parts, questions: Sequence[str], *,
               rng: jax.Array) -> list[Run]:
  """One batch of `name`'s episodes."""
  if check_system(name) in MEMORY_SYSTEMS and parts.bank is None:
    raise ValueError(f"baseline system {name!r} needs its memory bank (Parts.bank)")
  return _RUNNERS[name](parts, list(questions), rng)


def _executor_runs(parts: Parts, questions, openings, rng, texts=None, shown=None) -> list[Run]:
  executor = Executor(parts.generator, parts.searcher, parts.agents)
  trajectories = executor.run_openings(questions, openings, rng=rng)
  texts = texts or [None] * len(questions)
  shown = shown or [()] * len(questions)
  return [Run(t.answer, [t], t.info["turns"], text, "executor", ids)
          for t, text, ids in zip(trajectories, texts, shown)]


def _react(parts: Parts, questions, rng) -> list[Run]:
  return _executor_runs(parts, questions, [prompts.rule_messages(q, None, parts.agents.prompts)
                                           for q in questions], rng)


def _rag(parts: Parts, questions, rng) -> list[Run]:
  texts, shown = [], []
  for q in questions:
    found = parts.bank.retrieve(q, category=OTHERS)
    texts.append(skills_lib.render_memories([s.memory for s in found.correct],
                                            [s.memory for s in found.incorrect]).strip())
    shown.append(found.memory_ids)
  return _executor_runs(parts, questions, [prompts.rag_messages(q, t, parts.agents.prompts)
                                           for q, t in zip(questions, texts)], rng, texts, shown)


def _expel(parts: Parts, questions, rng) -> list[Run]:
  style, texts, shown = parts.agents.prompts, [], []
  for q in questions:
    top = nearest(parts.bank, q, 1)
    texts.append(top[0].workflow_summary if top else None)
    shown.append(tuple(m.id for m in top))
  return _executor_runs(parts, questions, [prompts.rule_messages(q, t, style)
                                           for q, t in zip(questions, texts)], rng, texts, shown)


def _episodes(parts: Parts, questions, rng, openings=None, texts=None, shown=None) -> list[Run]:
  planner = Planner(parts.generator, parts.agents)
  executor = Executor(parts.generator, parts.searcher, parts.agents)
  episodes = run_episode(planner, executor, questions, rng=rng, plan_openings=openings)
  texts = texts or [None] * len(questions)
  shown = shown or [()] * len(questions)
  return [Run(ep.y2, [ep.planner] + ep.executor, ep.executor[-1].info["turns"], text, "planner",
              ids, ep.plan) for ep, text, ids in zip(episodes, texts, shown)]


def _memento(parts: Parts, questions, rng) -> list[Run]:
  texts, shown = [], []
  for q in questions:
    found = parts.bank.retrieve(q, category=OTHERS)
    texts.append(prompts.render_cases([s.memory for s in found.correct],
                                      [s.memory for s in found.incorrect]))
    shown.append(found.memory_ids)
  openings = [prompts.memento_messages(q, t, parts.agents.prompts)
              for q, t in zip(questions, texts)]
  return _episodes(parts, questions, rng, openings, texts, shown)


def _plan_only(parts: Parts, questions, rng) -> list[Run]:
  a = parts.agents
  return _episodes(parts, questions, rng, [prompts.plan_only_messages(q, a.plan_word_limit,
                                                                      a.prompts)
                                           for q in questions])


_RUNNERS = {"react": _react, "rag": _rag, "expel": _expel, "memento": _memento,
            "plan_only": _plan_only}
