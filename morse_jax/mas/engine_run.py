"""MoRSE's inference on the generation engine (issue 55): each task's DAG advances on its own.

`runner.run` walks waves: every node of a wave, over all tasks of the batch, waits for the
wave's slowest merge and executor rows. Here a node's merger call is submitted as soon as its
parents are verified, its executor call as soon as its merger returns (a node with at most one
parent goes straight to its executor), all to one `llm.engine.Engine` shared by the batch: a
short task's next node decodes beside a long node of another task.

Same results as the wave path: the plan fixed before any call gives every node what the wave
path gives it: its greedy route (the router sees only the subtask), its merge experts (drawn in
wave order from `seed`, so random_subset draws the same subsets), and its rng key: row k of
wave w's executor call draws with fold_in(fold_in(rng, w), k), merge row m of the wave with
fold_in(key(0), m), as `llm.sample` keys its rows; the engine's draws depend on the key alone.
Per-row experts go through the engine's adapter (`Request.route`, one width for all rows: the
widest set, zero weights after a shorter one's ids). NodeStats.merge_seconds / wave_seconds
are this node's own merge and executor calls, submission to reply.

Where the engine cannot take a call the wave path runs instead: on a mesh of several devices
(the engine does not shard) the whole batch goes through `runner.run`; a call longer than the
engine's rows (EngineConfig.max_len), or one the engine failed (`EngineError`: its device call,
a non-finite row), runs alone through the static sampler with its planned key, logged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import jax
import numpy as np

from morse_jax import llm
from morse_jax.llm.engine import Engine, EngineConfig, Request, routes_of
from morse_jax.lora.experts import adapter_of
from morse_jax.lora.mixture import uniform_routes
from morse_jax.mas import runner
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import Subtask, SubtaskGraph
from morse_jax.tasks.base import Problem, TaskFamily

log = logging.getLogger(__name__)
PAGE_SIZE = 16


@dataclasses.dataclass(frozen=True)
class NodePlan:
  """What the wave path would give a node, fixed before any call."""

  wave: int
  route: list[int]  # 0-based subtask experts of the executor call
  executor_key: jax.Array
  merge_experts: list[int] | None = None  # None: at most one parent, no merge call
  merge_key: jax.Array | None = None


def plan(agents: Agents, tasks: Sequence[runner.TaskOutcome], router_params, rng: jax.Array,
         merge_mode: str, seed: int) -> dict[tuple[int, str], NodePlan]:
  """{(task index, node id): NodePlan} for every node, in the wave path's order of draws."""
  pick = np.random.default_rng(seed)
  waves = max(len(task.graph.waves()) for task in tasks)
  items = [runner.wave_items(tasks, w) for w in range(waves)]
  # Per wave, as the wave path routes: the router's batch shapes, and so its sums, are its.
  route_of = {(t, node.id): route for wave in items for (t, node), route in
              zip(wave, agents.greedy_routes(router_params, [node for _, node in wave]))}
  out = {}
  for w, wave in enumerate(items):
    merges = 0
    for k, (t, node) in enumerate(wave):
      merge = {}
      if len(node.depends_on) > 1:
        merge = dict(merge_experts=runner.merge_experts(
            agents, [route_of[t, p] for p in node.depends_on], merge_mode, pick),
                     merge_key=jax.random.fold_in(jax.random.key(0), merges))
        merges += 1
      out[t, node.id] = NodePlan(w, route_of[t, node.id],
                                 jax.random.fold_in(jax.random.fold_in(rng, w), k), **merge)
  return out


def expert_sets(agents: Agents, plans: dict) -> dict[tuple[int, str, str], list[int] | None]:
  """{(task, node, "merge" or "execute"): the call's expert set (None: the bare backbone)}."""
  out = {}
  for (t, i), p in plans.items():
    out[t, i, "execute"] = agents.expert_set("execute", p.route)
    if p.merge_experts is not None:
      out[t, i, "merge"] = agents.expert_set("merge", p.merge_experts)
  return out


def build_engine(agents: Agents, experts, sets: dict, slots: int, max_len: int, typical: int):
  """(an engine for these calls, {call: its Request.route}): rows of `max_len` tokens, a pool
  for every slot at `typical` tokens plus one full row (admission waits for pages beyond), about
  what the wave path's calls hold. The adapter's kernel is a per-row one: "merged" (one route
  for the whole call) cannot hold several routes."""
  adapter, routes = None, {}
  if agents.lora is not None:
    calls = list(sets)
    checked = [agents.lora.check_route(sets[c], f"route of {c}") for c in calls]
    kernel = "auto" if agents.kernel == "merged" else agents.kernel
    adapter = adapter_of(experts, uniform_routes(checked, max(map(len, checked))), agents.lora,
                         agents.model.config, kernel)
    routes = dict(zip(calls, routes_of(adapter)))
  pages = lambda tokens: -(-tokens // PAGE_SIZE)
  config = EngineConfig(slots=slots, max_len=max_len, page_size=PAGE_SIZE,
                        num_pages=min(slots * pages(typical), (slots - 1) * pages(max_len))
                        + pages(max_len) + 1)  # + the trash page
  return Engine(agents.model, config, adapter=adapter), routes


def runs_on_engine(agents: Agents) -> bool:
  """Whether the engine can run these agents' calls: one device (the engine does not shard)."""
  return agents.mesh is None or agents.mesh.size == 1


def row_sizes(agents: Agents, family: TaskFamily, tasks, limit: int) -> tuple[int, int]:
  """(tokens per engine row, a typical row's tokens). A row: the longest executor prompt
  without context plus room for the largest merge (each parent's artifact, then the merge's
  own reply) and the reply, within the model's positions (a longer call falls back to the
  static sampler). Typical: that prompt with a context of `limit` tokens, and its reply."""
  base = max(len(runner.executor_prompt(agents, family, task, task.graph.node(i), ""))
             for task in tasks for i in task.graph.topological_order())
  parents = max(len(task.graph.node(i).depends_on) for task in tasks
                for i in task.graph.topological_order())
  want = base + (max(parents, 1) + 2) * (limit + PAGE_SIZE)
  row = min(-(-want // PAGE_SIZE) * PAGE_SIZE, agents.model.config.max_position_embeddings)
  return row, min(base + 2 * limit, row)


def run(agents: Agents, family: TaskFamily, problems: Sequence[Problem],
        graphs: Sequence[SubtaskGraph], experts, router_params, *, rng: jax.Array,
        sampling: llm.SamplingConfig = llm.GREEDY, merge_mode: str = "union",
        seed: int = 0, keep_prompts: bool = False,
        slots: int | None = None) -> list[runner.TaskOutcome]:
  """`runner.run`'s call and outcomes on the engine (module docstring). slots: rows decoded
  together (None: the widest wave of the batch, the wave path's largest call)."""
  if not runs_on_engine(agents):
    return runner.run(agents, family, problems, graphs, experts, router_params, rng=rng,
                      sampling=sampling, merge_mode=merge_mode, seed=seed,
                      keep_prompts=keep_prompts)
  tasks = [runner.TaskOutcome(p, g) for p, g in zip(problems, graphs)]
  plans = plan(agents, tasks, router_params, rng, merge_mode, seed)
  sets = expert_sets(agents, plans)
  waves = max(len(g.waves()) for g in graphs)
  widest = max(len(runner.wave_items(tasks, w)) for w in range(waves))
  engine, routes = build_engine(agents, experts, sets, slots or widest,
                                *row_sizes(agents, family, tasks, agents.max_new_tokens))
  Walk(agents, family, tasks, plans, engine, routes, sets, experts, sampling,
       keep_prompts).run()
  return runner.finish(family, tasks)


@dataclasses.dataclass
class _Call:
  """A call to make: its node, role ("merge", "execute"), prompt, sampling, key, and what to do
  with its reply and seconds."""

  t: int
  node: Subtask
  role: str
  prompt: list[int]
  sampling: llm.SamplingConfig
  key: jax.Array
  then: Callable
  submitted: float = 0.0


class Walk:
  """The batch's DAGs on one engine: submits each node's calls when their inputs are in and
  steps the engine until every node is done. `fallbacks`: calls that ran on the static sampler
  (longer than the engine's rows, or failed in the engine)."""

  def __init__(self, agents, family, tasks, plans, engine, routes, sets, experts, sampling,
               keep_prompts):
    self.agents, self.family, self.tasks, self.plans = agents, family, tasks, plans
    self.engine, self.routes, self.sets, self.experts = engine, routes, sets, experts
    self.sampling, self.keep_prompts = sampling, keep_prompts
    self.limit = agents.max_new_tokens
    self.settings = llm.GenerationSettings.for_model(agents.model, self.limit, sampling)
    self.live: dict[object, _Call] = {}  # handle -> call
    self.fallbacks = 0

  def run(self) -> None:
    for t, task in enumerate(self.tasks):
      for i in task.graph.topological_order():
        if not task.graph.node(i).depends_on:
          self._start(t, task.graph.node(i))
    while self.live:
      self.engine.step()
      for handle, call in [(h, c) for h, c in self.live.items() if h.done]:
        del self.live[handle]
        if handle.error is not None:
          self._static(call, f"the engine failed it: {handle.error}")
        else:
          call.then(self.agents.reply(handle.result().tokens, self.limit),
                    time.perf_counter() - call.submitted)

  def _start(self, t: int, node: Subtask) -> None:
    """A node whose parents are done: its merge call, or its executor call at once."""
    task, p = self.tasks[t], self.plans[t, node.id]
    if p.merge_experts is None:
      return self._execute(t, node, runner.parent_context(task, node), 0.0)
    self._submit(_Call(t, node, "merge", runner.merger_prompt(self.agents, task, node),
                       llm.GREEDY, p.merge_key,
                       lambda reply, seconds: self._execute(t, node, reply.text, seconds)))

  def _execute(self, t: int, node: Subtask, context: str, merge_seconds: float) -> None:
    task, p = self.tasks[t], self.plans[t, node.id]
    prompt = runner.executor_prompt(self.agents, self.family, task, node, context)

    def executed(reply, seconds):
      task.nodes[node.id] = runner.node_outcome(
          self.agents, self.family, task, node, p.route, context, prompt, reply, wave=p.wave,
          merge_seconds=merge_seconds, wave_seconds=seconds, keep_prompts=self.keep_prompts)
      self._children_of(t, node.id)

    self._submit(_Call(t, node, "execute", prompt, self.sampling, p.executor_key, executed))

  def _children_of(self, t: int, node_id: str) -> None:
    task = self.tasks[t]
    for child in task.graph.topological_order():
      parents = task.graph.parents(child)
      if node_id in parents and all(p in task.nodes for p in parents):
        self._start(t, task.graph.node(child))

  def _submit(self, call: _Call) -> None:
    call.submitted = time.perf_counter()
    request = Request(call.prompt, self.limit, call.sampling, self.settings.eos_ids, call.key,
                      self.routes.get((call.t, call.node.id, call.role)))
    try:
      handle = self.engine.submit(request)
    except ValueError as e:
      if len(call.prompt) + self.limit <= self.engine.config.max_len:
        raise  # not a question of size: a bug, not a fallback
      return self._static(call, str(e))
    self.live[handle] = call

  def _static(self, call: _Call, why: str) -> None:
    """The call on the static sampler, with its planned key as the row's own."""
    self.fallbacks += 1
    log.warning("engine run: node %r's %s call of %d prompt tokens goes to the static "
                "sampler: %s", call.node.id, call.role, len(call.prompt), why)
    experts = self.sets[call.t, call.node.id, call.role]
    [reply] = self.agents.replies([call.prompt], None if experts is None else [experts],
                                  self.experts, rng=call.key, row_keys=call.key[None],
                                  sampling=call.sampling)
    call.then(reply, time.perf_counter() - call.submitted)
