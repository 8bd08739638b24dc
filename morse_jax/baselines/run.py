"""The baseline systems as evaluations beside `single`: the same frozen backbone (`Agents`, no
adapter), the same token limit per call (`Agents.max_new_tokens`, config.eval.max_new_tokens),
the same verifier on the final reply and the same outcomes (one node per task, `TaskOutcome`), so
`experiments.records` and `evaluation.summarize` read them as they read `single`'s. The node's
details add the system's calls (count and phases in order) and its fallbacks; its stats sum the
tokens of every call. The calls run on the generation engine (config.eval.engine, one device:
`backbones.EngineBackbone`, no task waits for another's calls) or on the static sampler in
rounds.

  chatchain  ChatDev's ChatChain (`chatchain`)
  macnet     MacNet (`macnet`): config.baseline.macnet_topology / macnet_nodes, or
             macnet_edges ("0->1,0->2") for a topology of one's own
  aflow      AFlow's HumanEval workflow, run fixed (`aflow`); drafts at aflow_temperature
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax

from morse_jax.baselines import aflow, backbones, chatchain, macnet, topology
from morse_jax.baselines.flow import Backbone, Chat, Rounds, Task, drive
from morse_jax.mas import graph as graph_lib
from morse_jax.mas.agents import Agents
from morse_jax.mas.engine_run import runs_on_engine
from morse_jax.mas.runner import NodeOutcome, NodeStats, TaskOutcome
from morse_jax.tasks.base import NodeScore, Problem

SYSTEMS = ("chatchain", "macnet", "aflow")


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
  """config.baseline: the baselines' own settings (the rest is `single`'s)."""

  macnet_topology: str = "random"  # topology.TOPOLOGIES
  macnet_nodes: int = 4
  macnet_edges: str = ""  # "0->1,1->2": these edges instead of a generated topology
  aflow_temperature: float = 0.8  # AFlow's three drafts (every other call greedy)

  def __post_init__(self):
    if self.aflow_temperature < 0:
      raise ValueError(f"BaselineConfig.aflow_temperature must be >= 0, got "
                       f"{self.aflow_temperature!r}")
    self.network(0)  # a topology that is not a DAG, or a bad name or count, is refused here

  def network(self, seed: int) -> macnet.Network:
    edges = (topology.parse(self.macnet_edges) if self.macnet_edges else
             topology.generate(self.macnet_topology, self.macnet_nodes, seed))
    return macnet.Network.build(edges, 0 if self.macnet_edges else self.macnet_nodes)


def flows(system: str, tasks: Sequence[Task], settings: BaselineConfig, seed: int):
  if system == "chatchain":
    return [chatchain.flow(t) for t in tasks]
  if system == "macnet":
    network = settings.network(seed)
    return [macnet.flow(t, network) for t in tasks]
  if system == "aflow":
    return [aflow.flow(t, settings.aflow_temperature) for t in tasks]
  raise ValueError(f"baseline system {system!r} is not one of {SYSTEMS}")


def backbone(agents: Agents, engine: bool) -> Backbone:
  """The batch's backbone: the generation engine (`engine` and one device), else the static
  sampler in rounds."""
  if engine and runs_on_engine(agents):
    return backbones.EngineBackbone(agents)
  return Rounds(backbones.static_chat(agents))


def prompts_text(task: Task) -> str:
  """Every call's messages, in order, each under its phase."""
  return "\n\n".join(f"## {c.phase}\n" + "\n".join(m["content"] for m in c.prompt or ())
                     for c in task.calls)


def outcome(task: Task, family, reply: str, seconds: float, keep_prompts: bool) -> TaskOutcome:
  """The task as `single`'s one node: the final reply scored by the family's verifier."""
  start = time.perf_counter()
  node = graph_lib.single_node(task.problem.statement)
  score = family.score_node(task.problem, node.nodes[0].to_dict(), reply, {})
  details = {**score.details, "calls": len(task.calls),
             "phases": [c.phase for c in task.calls], "fallbacks": dict(task.fallbacks)}
  stats = NodeStats(
      wave=0, prompt_tokens=sum(c.prompt_tokens for c in task.calls), context_tokens=0,
      generated_tokens=sum(c.generated_tokens for c in task.calls),
      cut=any(c.cut for c in task.calls), merge_seconds=0.0, wave_seconds=seconds,
      score_seconds=time.perf_counter() - start,
      prompt=prompts_text(task) if keep_prompts else None)
  done = TaskOutcome(task.problem, node)
  done.nodes["1"] = NodeOutcome("1", [], "", reply,
                                NodeScore(score.reward, score.passed, details), stats)
  done.score = family.score_problem(task.problem, done.artifacts())
  return done


def run(system: str, chat: Backbone | Chat, family, problems: Sequence[Problem],
        settings: BaselineConfig = BaselineConfig(), *, seed: int = 0,
        keep_prompts: bool = False, tester=None, rng: jax.Array | None = None
        ) -> list[TaskOutcome]:
  """The system over a batch of tasks on `chat` (a `Backbone`, or a `Chat` run in rounds: each
  round of calls one call over the batch). tester(problem, code) -> (passed, report) replaces
  the family's visible-example run. rng: the calls' keys (`flow.ask_key`; None: key(seed))."""
  tasks = [Task(p, family, keep_prompts=keep_prompts,
                tester=None if tester is None else (lambda code, p=p: tester(p, code)))
           for p in problems]
  start = time.perf_counter()
  finals = drive(flows(system, tasks, settings, seed), tasks, chat,
                 jax.random.key(seed) if rng is None else rng)
  seconds = time.perf_counter() - start
  return [outcome(t, family, reply, seconds, keep_prompts) for t, reply in zip(tasks, finals)]
