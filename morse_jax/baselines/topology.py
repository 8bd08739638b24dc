"""MacNet's topologies (ChatDev branch macnet, `generate_graph.py`) over agents 0..n-1, as
directed edges (source, target), and the check that a given set of edges is a DAG."""

from __future__ import annotations

import random
from typing import Sequence

TOPOLOGIES = ("chain", "star", "tree", "mesh", "random")
Edges = list[tuple[int, int]]


def generate(topology: str, nodes: int, seed: int = 0) -> Edges:
  """chain 0->1->...; star 0->i; tree: node i -> 2i+1, 2i+2 (a binary tree); mesh: every
  u -> v with u < v (MacNet's "net"); random: a seeded draw of between n-1 and n(n-1)/2 of the
  mesh's edges (every draw a DAG: edges only go up in id)."""
  if topology not in TOPOLOGIES:
    raise ValueError(f"macnet topology {topology!r} is not one of {TOPOLOGIES}")
  if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
    raise ValueError(f"macnet nodes={nodes!r} must be an integer >= 1")
  if topology == "chain":
    return [(i, i + 1) for i in range(nodes - 1)]
  if topology == "star":
    return [(0, i) for i in range(1, nodes)]
  if topology == "tree":
    return [(i, c) for c in range(1, nodes) for i in [(c - 1) // 2]]
  mesh = [(u, v) for u in range(nodes) for v in range(u + 1, nodes)]
  if topology == "mesh":
    return mesh
  rng = random.Random(seed)
  rng.shuffle(mesh)
  return sorted(mesh[:rng.randint(nodes - 1, len(mesh))]) if mesh else []


def parse(text: str) -> Edges:
  """Edges written "0->1,0->2,1->3" (MacNet's config form, one edge per item)."""
  edges = []
  for item in filter(None, (part.strip() for part in text.split(","))):
    parts = item.split("->")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
      raise ValueError(f"macnet edge {item!r} is not of the form 'source->target' (node ids)")
    edges.append((int(parts[0]), int(parts[1])))
  return edges


def check_dag(edges: Sequence[tuple[int, int]]) -> None:
  """Refuses a self-loop or an edge that closes a cycle, naming it and the cycle."""
  successors: dict[int, list[int]] = {}
  for u, v in edges:
    if u == v:
      raise ValueError(f"macnet topology is not a DAG: edge {u}->{v} is a self-loop")
    path = _path(successors, v, u)
    if path is not None:
      cycle = "->".join(str(n) for n in [u] + path)
      raise ValueError(f"macnet topology is not a DAG: edge {u}->{v} closes the cycle {cycle}")
    successors.setdefault(u, []).append(v)


def _path(successors: dict[int, list[int]], start: int, goal: int) -> list[int] | None:
  """A path start -> ... -> goal along the edges so far, None when there is none."""
  stack, seen = [(start, [start])], {start}
  while stack:
    node, path = stack.pop()
    if node == goal:
      return path
    for nxt in successors.get(node, ()):
      if nxt not in seen:
        seen.add(nxt)
        stack.append((nxt, path + [nxt]))
  return None
