"""Subtask graphs: nodes {id, title, description, depends_on}, validated, with JSON in and out.

Validation names the problem, because plans come from a model: unknown dependency, self-loop,
cycle (with its nodes), duplicate id, empty graph, too many nodes, missing or mistyped fields.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from typing import Any, Mapping, Sequence

from morse_jax import jsonsafe

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
  if isinstance(node_id, bool) or not isinstance(node_id, (str, int)) or _text(node_id) == "":
    raise GraphError(f"node {index}: field 'id' must be a non-empty string or integer, got "
                     f"{_short(node_id)}")
  for field in ("title", "description"):
    if not isinstance(raw[field], str):
      raise GraphError(f"node {index} (id {_short(node_id)}): field {field!r} must be a string, "
                       f"got {_short(raw[field])}")
  deps = raw.get("depends_on", [])
  if deps is None:
    deps = []
  if not isinstance(deps, (list, tuple)) or any(
      isinstance(d, bool) or not isinstance(d, (str, int)) for d in deps):
    raise GraphError(f"node {index} (id {_short(node_id)}): field 'depends_on' must be a list of "
                     f"ids, got {_short(deps)}")
  ids = [_text(d) for d in deps]
  if any(isinstance(d, int) and i == "" for d, i in zip(deps, ids)):
    raise GraphError(f"node {index} (id {_short(node_id)}): an id in 'depends_on' is an integer "
                     f"too long to write")
  return Subtask(_text(node_id), raw["title"], raw["description"], tuple(ids))


def _text(node_id: str | int) -> str:
  """The id as a string; '' for an integer past Python's int-string limit (4300 digits)."""
  try:
    return str(node_id)
  except ValueError:
    return ""


def _short(value: Any, limit: int = 80) -> str:
  """repr of a value from a plan, cut to `limit` characters (never raises)."""
  try:
    text = repr(value)
  except (ValueError, RecursionError):
    text = f"<{type(value).__name__}>"
  return text if len(text) <= limit else text[:limit] + "..."


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
      obj = jsonsafe.loads(text)
    except json.JSONDecodeError as e:  # also too deep, NaN, an integer too long (jsonsafe)
      raise GraphError(f"plan is not valid JSON: {e}") from None
    return cls.from_obj(obj, max_nodes)

  def to_json(self) -> str:
    return json.dumps({"subtasks": [n.to_dict() for n in self.nodes]})

  @functools.cached_property
  def _by_id(self) -> dict[str, Subtask]:
    return {n.id: n for n in self.nodes}

  def node(self, node_id: str) -> Subtask:
    return self._by_id[node_id]

  def parents(self, node_id: str) -> tuple[str, ...]:
    return self.node(node_id).depends_on

  def waves(self) -> list[list[str]]:
    """Nodes grouped by depth: every node's parents lie in earlier waves (input order kept)."""
    depth = self._depths()
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for n in self.nodes:
      out[depth[n.id]].append(n.id)
    return out

  def topological_order(self) -> list[str]:
    """Kahn's order in rounds: each round takes every node whose parents are all taken, in input
    order (so the order is the waves, one after another). Linear in nodes + edges."""
    return [node_id for wave in self.waves() for node_id in wave]

  def _depths(self) -> dict[str, int]:
    """Each node's depth (0 without parents, else 1 + its deepest parent's), computed in a
    Kahn order (a queue, not rounds): linear in nodes + edges."""
    children: dict[str, list[str]] = {n.id: [] for n in self.nodes}
    waiting = {n.id: len(set(n.depends_on)) for n in self.nodes}
    for n in self.nodes:
      for d in set(n.depends_on):
        children[d].append(n.id)
    depth = {n.id: 0 for n in self.nodes}
    queue = collections.deque(n.id for n in self.nodes if not waiting[n.id])
    while queue:
      u = queue.popleft()
      for v in children[u]:
        depth[v] = max(depth[v], depth[u] + 1)
        waiting[v] -= 1
        if not waiting[v]:
          queue.append(v)
    return depth


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
  """One cycle as [a, b, ..., a] (depth-first search over depends_on, with an explicit stack:
  a 10^4-node chain must not hit Python's recursion limit), or None. Linear in nodes + edges."""
  deps = {n.id: n.depends_on for n in nodes}
  state: dict[str, int] = {}  # 1 on the path, 2 done
  for n in nodes:
    if n.id in state:
      continue
    path: list[str] = [n.id]
    where: dict[str, int] = {n.id: 0}  # node -> index on the path
    todo = [iter(deps[n.id])]
    state[n.id] = 1
    while todo:
      v = next(todo[-1], None)
      if v is None:
        todo.pop()
        u = path.pop()
        del where[u]
        state[u] = 2
        continue
      if state.get(v) == 1:
        return path[where[v]:] + [v]
      if v not in state:
        state[v] = 1
        where[v] = len(path)
        path.append(v)
        todo.append(iter(deps[v]))
  return None
