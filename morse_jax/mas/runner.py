"""Runs task graphs node by node: Merger, then Executor, then the verifier, wave by wave.

A wave holds, for every task of the batch, the nodes whose parents are all done (graph depth), so
independent branches of one task and the nodes of different tasks share one sampler call. A node
whose artifact fails verification is blocked: downstream nodes see it as missing.

  run    inference: routes are the router's top-K, decoding is greedy by default.
  train  the same walk, but the executors of a wave are one `Trainer.step` (B routes x M
         candidates per node, rewards from the verifier, one HGRPO/GRPO update); the best
         candidate of each node flows downstream.
Merge calls are not trained yet: they run greedily with the current experts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from morse_jax import llm
from morse_jax.lora import router as router_lib
from morse_jax.mas import prompts
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import Subtask, SubtaskGraph
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore, TaskFamily


@dataclasses.dataclass(frozen=True)
class NodeStats:
  """What `run` measured of one node's calls (for the evaluation records)."""

  wave: int
  prompt_tokens: int  # the executor prompt, chat template included
  context_tokens: int  # the context the merger handed over (0: none)
  generated_tokens: int  # the executor's reply, a final stop token included
  cut: bool  # the reply ended at max_new_tokens, not at a stop token
  merge_seconds: float  # the wave's merge sampler call (shared by the wave's nodes; 0: none)
  wave_seconds: float  # the wave's executor sampler call, shared by the wave's nodes
  score_seconds: float  # this node's verifier call
  prompt: str | None = None  # the executor prompt as text, only when `run(keep_prompts=True)`


@dataclasses.dataclass
class NodeOutcome:
  node_id: str
  subtask_experts: list[int]  # 0-based subtask experts of the executor call
  context: str  # what the merger handed the executor
  artifact: str
  score: NodeScore
  stats: NodeStats | None = None  # set by `run`, not by `train`


@dataclasses.dataclass
class TaskOutcome:
  problem: Problem
  graph: SubtaskGraph
  nodes: dict[str, NodeOutcome] = dataclasses.field(default_factory=dict)
  score: ProblemScore | None = None

  def step_rewards(self) -> list[float]:
    return [self.nodes[i].score.reward for i in self.graph.topological_order()]

  def artifacts(self) -> dict[str, str | None]:
    """Passed artifacts by node id; None for blocked nodes."""
    return {i: (o.artifact if o.score.passed else None) for i, o in self.nodes.items()}


def _node_dict(node: Subtask) -> dict[str, Any]:
  return node.to_dict()


def _ancestors(graph: SubtaskGraph, node_id: str) -> list[str]:
  """All ancestors in topological order."""
  seen: set[str] = set()
  stack = list(graph.parents(node_id))
  while stack:
    u = stack.pop()
    if u not in seen:
      seen.add(u)
      stack.extend(graph.parents(u))
  return [i for i in graph.topological_order() if i in seen]


def upstream(task: TaskOutcome, node_id: str) -> dict[str, str]:
  """Passed ancestors' artifacts, in topological order (what the verifier may prepend)."""
  return {i: task.nodes[i].artifact for i in _ancestors(task.graph, node_id)
          if task.nodes[i].score.passed}


def _wave_items(tasks: Sequence[TaskOutcome], wave: int):
  return [(t, task.graph.node(i)) for t, task in enumerate(tasks)
          for i in (task.graph.waves()[wave] if wave < len(task.graph.waves()) else [])]


def merge_contexts(agents: Agents, tasks: Sequence[TaskOutcome], items, experts, merge_mode: str,
                   rng: np.random.Generator) -> list[str]:
  """Per item: "" without parents, the parent's artifact with one, an LLM merge with several
  (role expert "merge" plus the union, or a subset, of the parents' subtask experts)."""
  contexts: list[str | None] = [None] * len(items)
  merge_rows, merge_prompts, merge_sets = [], [], []
  for k, (t, node) in enumerate(items):
    task, parents = tasks[t], node.depends_on
    if not parents:
      contexts[k] = ""
    elif len(parents) == 1:
      parent = task.nodes[parents[0]]
      contexts[k] = parent.artifact if parent.score.passed else (
          f"(missing: the result of '{task.graph.node(parents[0]).title}' failed verification)")
    else:
      shown = [(task.graph.node(p).title, task.artifacts()[p]) for p in parents]
      subtask = router_lib.merge_node_experts([task.nodes[p].subtask_experts for p in parents],
                                              merge_mode, agents.router.top_k if agents.router
                                              else 0, rng)
      merge_rows.append(k)
      merge_prompts.append(agents.tokens(prompts.merger(node, shown)))
      merge_sets.append(agents.expert_set("merge", subtask))
  texts = agents.generate(merge_prompts, merge_sets, experts, rng=jax.random.key(0))
  for k, text in zip(merge_rows, texts):
    contexts[k] = text
  return contexts


def _executor_prompts(agents, family, tasks, items, contexts):
  return [agents.tokens(prompts.executor(tasks[t].problem.statement, node, contexts[k],
                                         family.executor_instructions(tasks[t].problem,
                                                                      _node_dict(node))))
          for k, (t, node) in enumerate(items)]


def _finish(family: TaskFamily, tasks: Sequence[TaskOutcome]) -> list[TaskOutcome]:
  for task in tasks:
    task.score = family.score_problem(task.problem, task.artifacts())
  return list(tasks)


def run(agents: Agents, family: TaskFamily, problems: Sequence[Problem],
        graphs: Sequence[SubtaskGraph], experts, router_params, *, rng: jax.Array,
        sampling: llm.SamplingConfig = llm.GREEDY, merge_mode: str = "union",
        seed: int = 0, keep_prompts: bool = False) -> list[TaskOutcome]:
  """Inference over a batch of tasks; one executor sampler call per wave. Every node gets its
  `NodeStats`; keep_prompts also keeps the executor prompt's text in them."""
  tasks = [TaskOutcome(p, g) for p, g in zip(problems, graphs)]
  pick = np.random.default_rng(seed)
  tokenizer = agents.model.tokenizer
  for wave in range(max(len(g.waves()) for g in graphs)):
    items = _wave_items(tasks, wave)
    merging = any(len(node.depends_on) > 1 for _, node in items)
    start = time.perf_counter()
    contexts = merge_contexts(agents, tasks, items, experts, merge_mode, pick)
    merge_seconds = time.perf_counter() - start if merging else 0.0
    routes = agents.greedy_routes(router_params, [node for _, node in items])
    sets = [agents.expert_set("execute", r) for r in routes]  # None rows without LoRA
    token_prompts = _executor_prompts(agents, family, tasks, items, contexts)
    start = time.perf_counter()
    replies = agents.replies(token_prompts, sets, experts, rng=jax.random.fold_in(rng, wave),
                             sampling=sampling)
    wave_seconds = time.perf_counter() - start
    for k, (t, node) in enumerate(items):
      start = time.perf_counter()
      score = family.score_node(tasks[t].problem, _node_dict(node), replies[k].text,
                                upstream(tasks[t], node.id))
      score_seconds = time.perf_counter() - start
      stats = NodeStats(
          wave=wave, prompt_tokens=len(token_prompts[k]),
          context_tokens=len(tokenizer.encode(contexts[k])) if contexts[k] else 0,
          generated_tokens=replies[k].tokens, cut=replies[k].cut, merge_seconds=merge_seconds,
          wave_seconds=wave_seconds, score_seconds=score_seconds,
          prompt=tokenizer.decode(token_prompts[k], skip_special_tokens=False)
          if keep_prompts else None)
      tasks[t].nodes[node.id] = NodeOutcome(node.id, list(routes[k]), contexts[k],
                                            replies[k].text, score, stats)
  return _finish(family, tasks)


def _blocked_parent(task: TaskOutcome, node_id: str) -> str | None:
  return next((p for p in task.graph.parents(node_id) if not task.nodes[p].score.passed), None)


def train(trainer, state, agents: Agents, family: TaskFamily, problems: Sequence[Problem],
          graphs: Sequence[SubtaskGraph], *, merge_mode: str = "union", seed: int = 0,
          skip_blocked: bool = False):
  """One pass over a batch of tasks with one update per wave. Returns (state, outcomes,
  [metrics per wave]); the metrics add the wave's best-candidate pass rate.

  skip_blocked: a node with a blocked parent gets no rollout and scores 0 (a wave left empty
  makes no update). Only for families where such a node cannot pass: its rewards would all be
  0, a group with no signal that costs a rollout."""
  from morse_jax.rl.trainer import TrainNode

  tasks = [TaskOutcome(p, g) for p, g in zip(problems, graphs)]
  pick = np.random.default_rng(seed)
  history = []
  for wave in range(max(len(g.waves()) for g in graphs)):
    items = _wave_items(tasks, wave)
    if skip_blocked:
      live = []
      for t, node in items:
        parent = _blocked_parent(tasks[t], node.id)
        if parent is None:
          live.append((t, node))
        else:
          tasks[t].nodes[node.id] = NodeOutcome(
              node.id, [], "", "", NodeScore(0.0, False, {"reason": f"blocked: parent "
                                                                    f"{parent!r} failed"}))
      items = live
    if not items:
      continue
    contexts = merge_contexts(agents, tasks, items, state.experts, merge_mode, pick)
    token_prompts = _executor_prompts(agents, family, tasks, items, contexts)
    if agents.router is None:  # a fixed mixture: the role expert only, nothing to route
      nodes = [TrainNode(prompt=p, role="execute", experts=[]) for p in token_prompts]
    else:
      embeddings = agents.embeddings([node for _, node in items])
      nodes = [TrainNode(prompt=p, role="execute", embedding=e)
               for p, e in zip(token_prompts, embeddings)]
    scored: dict[int, tuple[str, NodeScore]] = {}

    def reward_fn(rollout):
      out = []
      for r, completion in enumerate(rollout.completions):
        k = rollout.node_of_row(r)
        t, node = items[k]
        text = agents.decode(completion)
        score = family.score_node(tasks[t].problem, _node_dict(node), text,
                                  upstream(tasks[t], node.id))
        scored[r] = (text, score)
        out.append(score.reward)
      return np.asarray(out, np.float32)

    state, metrics, rollout = trainer.step(state, nodes, reward_fn)
    per_node = rollout.routes_per_node * rollout.group_size
    roles = len(agents.lora.roles)
    passed = 0
    for k, (t, node) in enumerate(items):
      rows = range(k * per_node, (k + 1) * per_node)
      best = max(rows, key=lambda r: scored[r][1].reward)  # first best on ties
      text, score = scored[best]
      subtask = [e - roles for e in rollout.expert_sets[best][1:]]
      tasks[t].nodes[node.id] = NodeOutcome(node.id, subtask, contexts[k], text, score)
      passed += score.passed
    metrics["wave"] = wave
    metrics["best_candidate_pass"] = passed / len(items)
    history.append(metrics)
  return state, _finish(family, tasks), history
