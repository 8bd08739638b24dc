"""The planner: an LLM call that writes a subtask graph as JSON, parsed and validated, retried
with the error shown to the model, and replaced by a single-node graph (counted) when it still
fails. Plans can be made once for a dataset and stored (`save_plans` / `load_plans`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Callable, Sequence

from morse_jax import jsonsafe, textscan
from morse_jax.mas import prompts
from morse_jax.mas.graph import MAX_NODES, GraphError, SubtaskGraph, single_node
from morse_jax.tasks.base import Problem

# messages of every pending problem -> one reply each (one batched sampler call)
Generate = Callable[[Sequence[list[dict]]], list[str]]

# what may follow a plan's opening fence before the JSON (textscan.fenced: linear time)
_FENCE_HEAD = re.compile(r"(?:json)?\s*")


def parse_plan(text: str, max_nodes: int = MAX_NODES) -> SubtaskGraph:
  """The graph in a reply: a ```json block, else the outermost {...} or [...].

  Raises GraphError (a ValueError) and nothing else, in time linear in the reply's length."""
  candidates = [body.strip() for _, body in textscan.fenced(text, _FENCE_HEAD)]
  spans = []
  for open_, close in (("{", "}"), ("[", "]")):
    start, end = text.find(open_), text.rfind(close)
    if 0 <= start < end:
      spans.append((start, text[start:end + 1]))
  candidates += [c for _, c in sorted(spans)]  # the outermost bracket first
  if not candidates:
    raise GraphError("plan: the reply holds no JSON object or list")
  error = None
  for c in candidates:
    try:
      obj = jsonsafe.loads(c)
    except json.JSONDecodeError as e:  # also too deep, NaN, an integer too long (jsonsafe)
      error = error or GraphError(f"plan is not valid JSON: {e}")
      continue
    return SubtaskGraph.from_obj(obj, max_nodes)
  raise error


@dataclasses.dataclass
class PlanStats:
  plans: int = 0
  retries: int = 0
  fallbacks: int = 0
  errors: list[str] = dataclasses.field(default_factory=list)  # the last error of each fallback


def plan(problems: Sequence[Problem], generate: Generate, *, max_nodes: int = MAX_NODES,
         max_retries: int = 2, stats: PlanStats | None = None) -> list[SubtaskGraph]:
  """One graph per problem. Each round sends every still-failing problem in one batch."""
  stats = stats if stats is not None else PlanStats()
  graphs: list[SubtaskGraph | None] = [None] * len(problems)
  replies: list[str | None] = [None] * len(problems)
  errors: list[str | None] = [None] * len(problems)
  pending = list(range(len(problems)))
  for attempt in range(max_retries + 1):
    if not pending:
      break
    if attempt:
      stats.retries += len(pending)
    batch = [prompts.planner(problems[i].statement, max_nodes, replies[i], errors[i])
             for i in pending]
    answers = generate(batch)
    still = []
    for i, answer in zip(pending, answers):
      try:
        graphs[i] = parse_plan(answer, max_nodes)
      except GraphError as e:
        replies[i], errors[i] = answer, str(e)
        still.append(i)
    pending = still
  for i in pending:
    stats.fallbacks += 1
    stats.errors.append(f"{problems[i].id}: {errors[i]}")
    logging.warning("planner: %s falls back to a single node after %d tries: %s",
                    problems[i].id, max_retries + 1, errors[i])
    graphs[i] = single_node(problems[i].statement)
  stats.plans += len(problems)
  return graphs


def gold_or_plan(problems: Sequence[Problem], generate: Generate | None, **kwargs):
  """The dataset's gold graph where it has one; the planner for the others."""
  out: list[SubtaskGraph | None] = [
      SubtaskGraph.from_obj(list(p.gold_graph)) if p.gold_graph else None for p in problems]
  todo = [i for i, g in enumerate(out) if g is None]
  if todo:
    if generate is None:
      raise ValueError(f"gold_or_plan: problem {problems[todo[0]].id!r} has no gold graph and "
                       "no planner was given")
    for i, g in zip(todo, plan([problems[i] for i in todo], generate, **kwargs)):
      out[i] = g
  return out


def save_plans(path: str, problems: Sequence[Problem], graphs: Sequence[SubtaskGraph]) -> None:
  """JSONL {problem_id, subtasks}, written atomically."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for p, g in zip(problems, graphs):
      f.write(json.dumps({"problem_id": p.id, "subtasks": [n.to_dict() for n in g.nodes]}) + "\n")
  os.replace(tmp, path)


def load_plans(path: str, max_nodes: int = MAX_NODES) -> dict[str, SubtaskGraph]:
  out = {}
  with open(path) as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = jsonsafe.loads(line)
        out[str(row["problem_id"])] = SubtaskGraph.from_obj(row["subtasks"], max_nodes)
      except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError, GraphError
        raise GraphError(f"{path}:{line_no}: {type(e).__name__}: {e}") from None
  return out
