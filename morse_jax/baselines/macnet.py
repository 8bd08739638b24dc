"""MacNet (ChatDev branch macnet, `graph.py`, `config.yaml`): agents on a DAG refine each
other's code. As there: a virtual input node feeds every source agent and every sink agent feeds a
virtual output agent; on an edge u -> v agent v critiques u's code (the instructor's review prompt,
`<INFO> Finished` when it has no comment; skipped when u has no code yet, as for the sources, who
write from scratch) and rewrites it with the critique (the assistant's prompt); an agent with
several predecessors then aggregates their rewrites (the `cc_prompt`), in predecessor id order, as
one call; with one predecessor it keeps that rewrite. The output agent's code is scored.

Ours differs where MacNet's is built for files and GPT-4-sized budgets: the review and rewrite
prompts are ChatChain's CodeReviewComment / CodeReviewModification (MacNet's are these with the
compiler tool, left out here); aggregation is one call over all predecessors (MacNet aggregates
in units of 2 with up to 10 retries at a temperature falling with depth); an agent waits for all
its predecessors. An aggregation reply without code falls back to the first predecessor's code
(MacNet's fallback on a failed aggregation), counted.

Topologies: `topology.TOPOLOGIES`. Default random with 4 agents: the MacNet paper (Qian et al.,
2024, "Scaling Large-Language-Model-based Multi-Agent Collaboration") finds irregular (random)
topologies best balance quality and time, ahead of the regular ones; mesh is as good but its
n(n-1)/2 edges cost the most calls. Calls per task: sources + 2 x edges (sinks -> output included)
+ the aggregations (agents with several predecessors, the output agent with several sinks).
"""

from __future__ import annotations

import dataclasses

from morse_jax.baselines import chatchain, topology
from morse_jax.baselines.flow import Ask, Flow, Task, fence

SYSTEM = ("You are Programmer. You can write/create computer software or applications by providing "
          "a specific programming language to the computer. You have extensive computing and "
          "coding experience in many varieties of programming languages and platforms. To "
          "complete tasks, you must write a response that appropriately solves the requested "
          "instruction based on your expertise and customer's needs.")
AGGREGATE = (
    "You are an experienced and meticulous software analyst and developer, trusted by others to "
    "optimize and enhance their code. Now there are several programs that serve the same purpose "
    "and are currently competing. Now you need to carefully analyze and compare these programs to "
    "identify their strengths and weaknesses. Subsequently, you must generate only one new, "
    "improved, and runnable program: aggregate them into A SINGLE solution by carefully "
    "considering and merging their pros and discarding their cons. Think step by step and reason "
    "yourself to the right decisions and make sure we get it right. " + chatchain.FORMAT)
OUTPUT = "out"  # the virtual output agent


def _order(node) -> tuple[int, int]:
  """Agents by id, the output agent last."""
  return (1, 0) if node == OUTPUT else (0, node)


@dataclasses.dataclass(frozen=True)
class Network:
  """The agents' DAG: edges (source, target), checked acyclic, with the output agent's edges."""

  edges: tuple[tuple[int | str, int | str], ...]

  @classmethod
  def build(cls, edges: topology.Edges, nodes: int = 0) -> "Network":
    topology.check_dag(edges)
    ids = sorted({n for e in edges for n in e} | set(range(nodes)))
    if not ids:
      raise ValueError("macnet topology has no agent")
    sinks = [n for n in ids if not any(u == n for u, _ in edges)]
    return cls(tuple(sorted(edges)) + tuple((s, OUTPUT) for s in sinks))

  def predecessors(self, node) -> list:
    return sorted((u for u, v in self.edges if v == node), key=_order)

  def depths(self) -> list[list]:
    """Agents by longest distance from a source (each agent after all its predecessors)."""
    depth: dict = {}
    nodes = {n for e in self.edges for n in e}
    while len(depth) < len(nodes):
      for n in sorted(nodes - depth.keys(), key=_order):
        preds = self.predecessors(n)
        if all(p in depth for p in preds):
          depth[n] = 1 + max((depth[p] for p in preds), default=-1)
    return [sorted((n for n in nodes if depth[n] == d), key=_order)
            for d in range(max(depth.values()) + 1)]


def critique(task: Task, code: str) -> Ask:
  prompt = chatchain.review_prompt(task.problem.statement, "", code)
  return Ask("critique", [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": prompt}])


def rewrite(task: Task, code: str, comments: str) -> Ask:
  prompt = chatchain.modification_prompt(task.problem.statement, "", code, comments)
  return Ask("rewrite", [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": prompt}])


def aggregate(task: Task, codes: list[str]) -> Ask:
  shown = "\n\n".join(f"Program {chr(65 + i)}:\n{fence(c)}" for i, c in enumerate(codes))
  return Ask("aggregate", [{"role": "system", "content": AGGREGATE},
                           {"role": "user", "content": f'Task: "{task.problem.statement}"\n\n'
                                                       + shown}])


def flow(task: Task, network: Network) -> Flow:
  code: dict = {}
  for layer in network.depths():
    if not any(network.predecessors(n) for n in layer):  # the sources write from scratch
      replies = yield [rewrite(task, "", "None.") for _ in layer]
      code.update({n: task.revise("write", r, "") for n, r in zip(layer, replies)})
      continue
    pairs = [(u, v) for v in layer for u in network.predecessors(v)]
    reviewed = [(u, v) for u, v in pairs if code[u].strip()]
    comments = {}
    if reviewed:
      comments = dict(zip(reviewed, (yield [critique(task, code[u]) for u, _ in reviewed])))
    replies = yield [rewrite(task, code[u], comments.get((u, v), "None.")) for u, v in pairs]
    rewritten = {pair: task.revise("rewrite", r, code[pair[0]])
                 for pair, r in zip(pairs, replies)}
    merging = [v for v in layer if len(network.predecessors(v)) > 1]
    for v in layer:
      code[v] = rewritten[(network.predecessors(v)[0], v)]
    if merging:
      inputs = {v: [rewritten[(u, v)] for u in network.predecessors(v)] for v in merging}
      replies = yield [aggregate(task, inputs[v]) for v in merging]
      for v, reply in zip(merging, replies):
        code[v] = task.revise("aggregate", reply, inputs[v][0])
  return fence(code[OUTPUT]) if code[OUTPUT].strip() else ""
