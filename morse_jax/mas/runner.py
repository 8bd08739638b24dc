"""Runs task graphs node by node: Merger, then Executor, then the verifier, wave by wave.

A wave holds, for every task of the batch, the nodes whose parents are all done (graph depth), so
independent branches of one task and the nodes of different tasks share one sampler call. A node
whose artifact fails verification is blocked: downstream nodes see it as missing.

  run    inference: routes are the router's top-K, decoding is greedy by default.
  train  the same walk, but the calls of a wave are one `Trainer.step` (B routes x M
         candidates per node, rewards from the verifier, one HGRPO/GRPO update); the best
         candidate of each node flows downstream.

Training the Merger. At a node with several parents each executor candidate gets a merge of its
own: row j = b * M + m first samples the Merger with ["merge"] + route b's merge experts (the
parents' union, or a random subset drawn per route), then executor row j runs with that text
as its context. The pair is one trajectory scored once, by the verifier on the artifact (u_bm).
The merge row takes u_bm and joins the same update as a node of its own with the node's B x M
layout, so its advantage is executor row j's: HGRPO's A_within = (u_bm - mu_b) / (sigma_b +
eps), a baseline over merges that were followed by the same executor route (the router's choice
of b does not leak into the merge expert's credit); GRPO's node-wide advantage under grpo. The
router learns nothing from merge rows (mask 0: it did not draw the merge experts); mu_b, its
signal, averages over route b's M merges. The authors (github.com/lpwpower/MoRSE) train their
"aggregate" agent likewise as B routes x M candidates with within-route advantages, experts =
role + a random subset of the parents' subtask experts per route (`_select_aggregate_experts`),
router log-prob 0, a group of its own, but score it differently: `srdd/train.py` (`train_grpo`)
makes a node with >= 2 parents an aggregate node whose merge is the artifact (no executor call),
scored by the executors' proxy reward; `scicode/train.py` (`_build_srddstyle_training_entries`,
`_evaluate_aggregate_entry`) adds a separate aggregate entry per such node on the gold parent
code, scored parse_ok * (0.45 step test + 0.25 coverage of the parents' functions + 0.2 AST ok),
from epoch 2 on (`stage_aggregate_start_epoch`). We keep the paper's Merger -> Executor node,
so the merge is credited through the artifact it leads to (as in SRDD), with no
family-specific merge score. Cost: B * M merge samples per merge node (inference: one), and
that wave's executor rows each prefill their own prompt.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import numpy as np

from morse_jax import llm
from morse_jax.lora import router as router_lib
from morse_jax.mas import prompts
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import Subtask, SubtaskGraph
from morse_jax.rl.trainer import MergeCall, TrainNode
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


def node_dict(node: Subtask) -> dict[str, Any]:
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


def wave_items(tasks: Sequence[TaskOutcome], wave: int):
  return [(t, task.graph.node(i)) for t, task in enumerate(tasks)
          for i in (task.graph.waves()[wave] if wave < len(task.graph.waves()) else [])]


def _merge_inputs(agents: Agents, tasks: Sequence[TaskOutcome], items, merge_mode: str,
                  rng: np.random.Generator, routes: int = 1):
  """Per item: (context, None) with no parent or one; (None, (merger prompt, `routes` lists of
  0-based subtask experts)) with several (each list drawn on its own in random_subset mode)."""
  out = []
  for t, node in items:
    task, parents = tasks[t], node.depends_on
    if len(parents) < 2:
      out.append((parent_context(task, node), None))
    else:
      out.append((None, (merger_prompt(agents, task, node),
                         [merge_experts(agents, [task.nodes[p].subtask_experts for p in parents],
                                        merge_mode, rng) for _ in range(routes)])))
  return out


def parent_context(task: TaskOutcome, node: Subtask) -> str:
  """A node's context without a merge (at most one parent): "" or the parent's artifact, or a
  note that it failed verification."""
  if not node.depends_on:
    return ""
  [parent_id] = node.depends_on
  parent = task.nodes[parent_id]
  return parent.artifact if parent.score.passed else (
      f"(missing: the result of '{task.graph.node(parent_id).title}' failed verification)")


def merger_prompt(agents: Agents, task: TaskOutcome, node: Subtask) -> list[int]:
  shown = [(task.graph.node(p).title, task.artifacts()[p]) for p in node.depends_on]
  return agents.tokens(prompts.merger(node, shown))


def merge_experts(agents: Agents, parent_experts, merge_mode: str,
                  rng: np.random.Generator) -> list[int]:
  """One draw of a merge node's 0-based subtask experts from its parents' (in random_subset
  mode, `rng` is consumed: callers draw in wave order to get the same subsets)."""
  return router_lib.merge_node_experts(parent_experts, merge_mode,
                                       agents.router.top_k if agents.router else 0, rng)


def merge_contexts(agents: Agents, tasks: Sequence[TaskOutcome], items, experts, merge_mode: str,
                   rng: np.random.Generator) -> list[str]:
  """Per item: "" without parents, the parent's artifact with one, an LLM merge with several
  (role expert "merge" plus the union, or a subset, of the parents' subtask experts)."""
  inputs = _merge_inputs(agents, tasks, items, merge_mode, rng)
  merging = [k for k, (_, merge) in enumerate(inputs) if merge is not None]
  texts = agents.generate([inputs[k][1][0] for k in merging],
                          [agents.expert_set("merge", inputs[k][1][1][0]) for k in merging],
                          experts, rng=jax.random.key(0))
  contexts = [context for context, _ in inputs]
  for k, text in zip(merging, texts):
    contexts[k] = text
  return contexts


def reply_prefix(family: TaskFamily, problem: Problem, node: Subtask) -> str:
  """The start of the executor's reply that the family writes for the model (its optional
  `reply_prefix`): the prompt ends with it and the artifact begins with it."""
  prefix = getattr(family, "reply_prefix", None)
  return prefix(problem, node_dict(node)) if prefix else ""


def executor_prompt(agents, family, task: TaskOutcome, node: Subtask, context: str) -> list[int]:
  tokens = agents.tokens(prompts.executor(task.problem.statement, node, context,
                                          family.executor_instructions(task.problem,
                                                                       node_dict(node))))
  prefix = reply_prefix(family, task.problem, node)
  return tokens + agents.model.tokenizer.encode(prefix) if prefix else tokens


def _executor_prompts(agents, family, tasks, items, contexts):
  return [executor_prompt(agents, family, tasks[t], node, contexts[k])
          for k, (t, node) in enumerate(items)]


def finish(family: TaskFamily, tasks: Sequence[TaskOutcome]) -> list[TaskOutcome]:
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
  for wave in range(max(len(g.waves()) for g in graphs)):
    items = wave_items(tasks, wave)
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
      tasks[t].nodes[node.id] = node_outcome(
          agents, family, tasks[t], node, routes[k], contexts[k], token_prompts[k], replies[k],
          wave=wave, merge_seconds=merge_seconds, wave_seconds=wave_seconds,
          keep_prompts=keep_prompts)
  return finish(family, tasks)


def node_outcome(agents: Agents, family: TaskFamily, task: TaskOutcome, node: Subtask,
                 route: Sequence[int], context: str, prompt: list[int], reply, *, wave: int,
                 merge_seconds: float, wave_seconds: float, keep_prompts: bool) -> NodeOutcome:
  """A node's executor reply verified, with what was measured of it (`NodeStats`)."""
  tokenizer = agents.model.tokenizer
  start = time.perf_counter()
  text = reply_prefix(family, task.problem, node) + reply.text
  score = family.score_node(task.problem, node_dict(node), text, upstream(task, node.id))
  stats = NodeStats(
      wave=wave, prompt_tokens=len(prompt),
      context_tokens=len(tokenizer.encode(context)) if context else 0,
      generated_tokens=reply.tokens, cut=reply.cut, merge_seconds=merge_seconds,
      wave_seconds=wave_seconds, score_seconds=time.perf_counter() - start,
      prompt=tokenizer.decode(prompt, skip_special_tokens=False) if keep_prompts else None)
  return NodeOutcome(node.id, list(route), context, text, score, stats)


def _blocked_parent(task: TaskOutcome, node_id: str) -> str | None:
  return next((p for p in task.graph.parents(node_id) if not task.nodes[p].score.passed), None)


def train(trainer, state, agents: Agents, family: TaskFamily, problems: Sequence[Problem],
          graphs: Sequence[SubtaskGraph], *, merge_mode: str = "union", seed: int = 0,
          skip_blocked: bool = False, train_merges: bool = True):
  """One pass over a batch of tasks with one update per wave. Returns (state, outcomes,
  [metrics per wave]); the metrics add the wave's best-candidate pass rate.

  train_merges: merge calls are sampled per executor row and trained (above); False runs them
  greedily with the current experts, untrained (cheaper: the executors of a route then share
  one prompt, prefilled once), on the trainer's engine when its rollouts run on one.

  skip_blocked: a node with a blocked parent gets no rollout and scores 0 (a wave left empty
  makes no update). Only for families where such a node cannot pass: its rewards would all be
  0, a group with no signal that costs a rollout."""
  tasks = [TaskOutcome(p, g) for p, g in zip(problems, graphs)]
  pick = np.random.default_rng(seed)
  history = []
  sampler = getattr(trainer, "sampler", None)
  if sampler is not None and agents.model is trainer.model:  # merges on the rollouts' engine
    agents = dataclasses.replace(agents, sampler=sampler)
  for wave in range(max(len(g.waves()) for g in graphs)):
    items = wave_items(tasks, wave)
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
    if train_merges:
      inputs = _merge_inputs(agents, tasks, items, merge_mode, pick,
                             routes=trainer.rollout_config.routes_per_node)
    else:
      inputs = [(c, None) for c in merge_contexts(agents, tasks, items, state.experts,
                                                  merge_mode, pick)]
    merge_texts: dict[int, dict[int, str]] = {}  # item -> executor row in the node -> merge

    def merged_prompt(k, j, merge_tokens):
      t, node = items[k]
      merge_texts.setdefault(k, {})[j] = text = agents.decode(merge_tokens)
      return executor_prompt(agents, family, tasks[t], node, text)

    # A fixed mixture has the role expert only, nothing to route.
    embeddings = agents.embeddings([node for _, node in items]) if agents.router else None
    nodes = []
    for k, ((t, node), (context, merge)) in enumerate(zip(items, inputs)):
      route = dict(experts=[]) if embeddings is None else dict(embedding=embeddings[k])
      if merge is None:
        nodes.append(TrainNode(prompt=executor_prompt(agents, family, tasks[t], node, context),
                               role="execute", **route))
      else:
        nodes.append(TrainNode(role="execute", merge=MergeCall(
            merge[0], merge[1], functools.partial(merged_prompt, k)), **route))
    scored: dict[int, tuple[str, NodeScore]] = {}

    def reward_fn(rollout):
      out = []
      for r, completion in enumerate(rollout.completions):
        k = rollout.node_of_row(r)
        t, node = items[k]
        text = reply_prefix(family, tasks[t].problem, node) + agents.decode(completion)
        score = family.score_node(tasks[t].problem, node_dict(node), text,
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
      context = inputs[k][0] if k not in merge_texts else merge_texts[k][best - k * per_node]
      tasks[t].nodes[node.id] = NodeOutcome(node.id, subtask, context, text, score)
      passed += score.passed
    metrics["wave"] = wave
    metrics["best_candidate_pass"] = passed / len(items)
    history.append(metrics)
  return state, finish(family, tasks), history
