"""Supervised agent turns from the synthetic suite's gold data, one list of dicts per corpus.

A toy backbone only works in the pipeline if it was trained on exactly the chat turns the pipeline
sends, so every prompt here comes from `morse_jax.mas.prompts`, and the executor's context is
built by the runner's rules (`runner.merge_contexts`): no parent -> "", one parent -> its
artifact, several -> the merger's reply, which here is the merger turn's own target. Targets are
the gold answers: the gold graph for the planner, reference artifacts for the executor, and a
deterministic merge (the parents' code in one block) for the merger.

A turn is {"role": "plan" | "merge" | "execute", "messages": [...], "target": str,
"problem_id": str, "node_id": str | None}.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from morse_jax.execution import verifier
from morse_jax.mas import prompts
from morse_jax.mas.graph import MAX_NODES, Subtask
from morse_jax.tasks import synthetic
from morse_jax.tasks.base import Problem

ROLES = ("plan", "merge", "execute")


def plan_target(problem: Problem) -> str:
  """The gold graph in the planner's reply format (PLAN_FORMAT: default JSON separators)."""
  nodes = [{"id": str(n["id"]), "title": n["title"], "description": n["description"],
            "depends_on": [str(d) for d in n["depends_on"]]} for n in problem.gold_graph]
  return json.dumps({"subtasks": nodes})


def merge_target(artifacts: Sequence[str]) -> str:
  """The parents' code blocks, in the given order, in one ```python block (same layout as
  `synthetic.reference_artifact`, so the executor sees one familiar kind of context)."""
  codes = [(verifier.extract_code(a) or "").strip("\n") for a in artifacts]
  body = "\n\n".join(c for c in codes if c)
  return f"```python\n{body}\n```\n"


def _subtask(node: dict[str, Any]) -> Subtask:
  return Subtask(str(node["id"]), node["title"], node["description"],
                 tuple(str(d) for d in node["depends_on"]))


def problem_turns(problem: Problem, family: synthetic.Synthetic | None = None,
                  max_nodes: int = MAX_NODES) -> list[dict[str, Any]]:
  """The planner turn, then per gold node (in order) its merger turn if it has several parents
  and its executor turn."""
  family = family or synthetic.Synthetic()
  nodes = {str(n["id"]): _subtask(n) for n in problem.gold_graph}
  turns = [{"role": "plan", "messages": prompts.planner(problem.statement, max_nodes),
            "target": plan_target(problem), "problem_id": problem.id, "node_id": None}]
  for node_id, node in nodes.items():
    parents = list(node.depends_on)
    if not parents:
      context = ""
    elif len(parents) == 1:
      context = synthetic.reference_artifact(problem, parents[0])
    else:
      shown = [(nodes[p].title, synthetic.reference_artifact(problem, p)) for p in parents]
      context = merge_target([artifact for _, artifact in shown])
      turns.append({"role": "merge", "messages": prompts.merger(node, shown), "target": context,
                    "problem_id": problem.id, "node_id": node_id})
    instructions = family.executor_instructions(problem, node.to_dict())
    turns.append({"role": "execute",
                  "messages": prompts.executor(problem.statement, node, context, instructions),
                  "target": synthetic.reference_artifact(problem, node_id),
                  "problem_id": problem.id, "node_id": node_id})
  return turns


def turns(problems: Sequence[Problem], max_nodes: int = MAX_NODES) -> list[dict[str, Any]]:
  """All turns of all problems, problem by problem (deterministic)."""
  family = synthetic.Synthetic()
  return [t for p in problems for t in problem_turns(p, family, max_nodes)]


def executor_turns(problems: Sequence[Problem], categories: Sequence[str],
                   max_nodes: int = MAX_NODES) -> list[dict[str, Any]]:
  """The executor turns of the subtasks whose category is in `categories` (with gold contexts)."""
  by_id = {p.id: p for p in problems}
  return [t for t in turns(problems, max_nodes) if t["role"] == "execute"
          and by_id[t["problem_id"]].data["nodes"][t["node_id"]]["category"] in categories]


def texts(turn_list: Sequence[dict[str, Any]]) -> list[str]:
  """Every message and target string, to train a tokenizer on."""
  out = []
  for t in turn_list:
    out.extend(m["content"] for m in t["messages"])
    out.append(t["target"])
  return out
