"""Subtask graphs: nodes {id, title, description, depends_on}, validated, with JSON in and out.

Validation names the problem, because plans come from a model: unknown dependency, self-loop,
cycle (with its nodes), duplicate id, empty graph, too many nodes, missing or mistyped fields.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

MAX_NODES = 12


class GraphError(ValueError):
  """A plan is not a valid subtask graph; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Subtask:
  id: str
  title: str
  description: str
  depends_on: tuple[str, ...] = ()

  def to_dict(self) -> dict[str, Any]:
    return {"id": self.id, "title": self.title, "description": self.description,
            "depends_on": list(self.depends_on)}


def _node(raw: Any, index: int) -> Subtask:
  if not isinstance(raw, Mapping):
    raise GraphError(f"node {index}: expected an object, got {type(raw).__name__}")
  for field in ("id", "title", "description"):
    if field not in raw:
      raise GraphError(f"node {index}: missing field {field!r}")
  node_id = raw["id"]
  if isinstance(node_id, bool) or not isinstance(node_id, (str, int)) or str(node_id) == "":
    raise GraphError(f"node {index}: field 'id' must be a non-empty string or integer, got "
                     f"{node_id!r}")
  for field in ("title", "description"):
    if not isinstance(raw[field], str):
      raise GraphError(f"node {index} (id {node_id!r}): field {field!r} must be a string, got "
                       f"{raw[field]!r}")
  deps = raw.get("depends_on", [])
  if deps is None:
    deps = []
  if not isinstance(deps, (list, tuple)) or any(
      isinstance(d, bool) or not isinstance(d, (str, int)) for d in deps):
    raise GraphError(f"node {index} (id {node_id!r}): field 'depends_on' must be a list of ids, "
                     f"got {deps!r}")
  return Subtask(str(node_id), raw["title"], raw["description"], tuple(str(d) for d in deps))


@dataclasses.dataclass(frozen=True)
class SubtaskGraph:
  nodes: tuple[Subtask, ...]

  def __post_init__(self):
    validate(self.nodes)

  @classmethod
  def from_obj(cls, obj: Any, max_nodes: int = MAX_NODES) -> "SubtaskGraph":
    """A list of nodes, or an object holding one under "subtasks" / "nodes"."""
    if isinstance(obj, Mapping):
      key = next((k for k in ("subtasks", "nodes") if k in obj), None)
      if key is None:
        raise GraphError(f"plan: expected a list of nodes or an object with 'subtasks', got keys "
                         f"{sorted(obj)}")
      obj = obj[key]
    if not isinstance(obj, list):
      raise GraphError(f"plan: expected a list of nodes, got {type(obj).__name__}")
    if len(obj) > max_nodes:
      raise GraphError(f"plan has {len(obj)} nodes, more than the limit of {max_nodes}")
    return cls(tuple(_node(raw, i) for i, raw in enumerate(obj)))

  @classmethod
  def from_json(cls, text: str, max_nodes: int = MAX_NODES) -> "SubtaskGraph":
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      raise GraphError(f"plan is not valid JSON: {e}") from None
    return cls.from_obj(obj, max_nodes)

  def to_json(self) -> str:
    return json.dumps({"subtasks": [n.to_dict() for n in self.nodes]})

  def node(self, node_id: str) -> Subtask:
    for n in self.nodes:
      if n.id == node_id:
        return n
    raise KeyError(node_id)

  def parents(self, node_id: str) -> tuple[str, ...]:
    return self.node(node_id).depends_on

  def waves(self) -> list[list[str]]:
    """Nodes grouped by depth: every node's parents lie in earlier waves (input order kept)."""
    depth: dict[str, int] = {}
    for node_id in self.topological_order():
      depth[node_id] = 1 + max((depth[p] for p in self.parents(node_id)), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for n in self.nodes:
      out[depth[n.id]].append(n.id)
    return out

  def topological_order(self) -> list[str]:
    """Kahn's order; among ready nodes the earliest in the input comes first."""
    remaining = {n.id: set(n.depends_on) for n in self.nodes}
    order: list[str] = []
    while remaining:
      ready = [n.id for n in self.nodes if n.id in remaining and not remaining[n.id]]
      for node_id in ready:
        del remaining[node_id]
        for deps in remaining.values():
          deps.discard(node_id)
      order += ready
    return order


def single_node(statement: str, title: str = "Solve the task") -> SubtaskGraph:
  """The fallback plan: the whole task as one node."""
  return SubtaskGraph((Subtask("1", title, statement),))


def validate(nodes: Sequence[Subtask]) -> None:
  if not nodes:
    raise GraphError("plan is empty: it needs at least one node")
  seen: set[str] = set()
  for n in nodes:
    if n.id in seen:
      raise GraphError(f"duplicate node id {n.id!r}")
    seen.add(n.id)
  for n in nodes:
    for d in n.depends_on:
      if d == n.id:
        raise GraphError(f"node {n.id!r} depends on itself")
      if d not in seen:
        raise GraphError(f"node {n.id!r} depends on unknown node {d!r}")
  cycle = _find_cycle(nodes)
  if cycle:
    raise GraphError(f"dependency cycle: {' -> '.join(cycle)}")


def _find_cycle(nodes: Sequence[Subtask]) -> list[str] | None:
  """One cycle as [a, b, ..., a] (depth-first search over depends_on), or None."""
  deps = {n.id: n.depends_on for n in nodes}
  state: dict[str, int] = {}  # 1 on the stack, 2 done
  stack: list[str] = []

  def visit(u: str) -> list[str] | None:
    state[u] = 1
    stack.append(u)
    for v in deps[u]:
      if state.get(v) == 1:
        return stack[stack.index(v):] + [v]
      if v not in state and (found := visit(v)):
        return found
    stack.pop()
    state[u] = 2
    return None

  for n in nodes:
    if n.id not in state and (found := visit(n.id)):
      return found
  return None
