"""Chat messages for the three agent calls: planner, merger, executor."""

from __future__ import annotations

from typing import Sequence

from morse_jax.mas.graph import Subtask

PLAN_FORMAT = ('{"subtasks": [{"id": "1", "title": "...", "description": "...", '
               '"depends_on": []}, ...]}')


def planner(statement: str, max_nodes: int, previous: str | None = None,
            error: str | None = None) -> list[dict]:
  """The planner writes the graph as JSON; a retry shows it its last reply and what was wrong."""
  messages = [
      {"role": "system", "content": (
          "You are a planner. Split the task into a small graph of subtasks, at most "
          f"{max_nodes}. Each subtask asks for one piece of the solution; depends_on lists the "
          "ids of the subtasks whose results it needs. Reply with JSON only, in the form "
          f"{PLAN_FORMAT}")},
      {"role": "user", "content": statement}]
  if previous is not None:
    messages += [{"role": "assistant", "content": previous},
                 {"role": "user", "content": f"That plan is invalid: {error}. Reply with a "
                                             "corrected plan, JSON only."}]
  return messages


def merger(node: Subtask, parents: Sequence[tuple[str, str | None]]) -> list[dict]:
  """parents: (title, artifact or None when it failed verification)."""
  parts = []
  for title, artifact in parents:
    parts.append(f"## {title}\n" + (artifact if artifact is not None
                                    else "(missing: this result failed verification)"))
  return [
      {"role": "system", "content": (
          "You are a merger. Combine the results of earlier subtasks into one consistent context "
          "for the next subtask: keep every definition it may need, drop repetition.")},
      {"role": "user", "content": f"Next subtask: {node.title}: {node.description}\n\n"
                                  + "\n\n".join(parts)}]


def executor(statement: str, node: Subtask, context: str, instructions: str) -> list[dict]:
  user = f"Task: {statement}\n\nSubtask: {node.title}: {node.description}\n"
  if context:
    user += f"\nResults of earlier subtasks:\n{context}\n"
  if instructions:
    user += f"\n{instructions}"
  return [{"role": "system", "content": "You are an executor. Solve the subtask you are given."},
          {"role": "user", "content": user}]
