"""Per-row mixtures of LoRA experts on one projection: four kernels that give the same numbers.

A route per row is `idx [b, e]` (expert ids) with weights `w [b, e]` (uniform 1/|E| by default;
padding slots carry weight 0). For x [b, t, d], W [o, d] (our [out, in] layout),
A [K, d, r], B [K, r, o]:

  y = x W^T + bias + scale * sum_e w[b, e] (x A[idx[b, e]]) B[idx[b, e]]

- `dense`: every expert, weighted by the scattered mixture [b, K]; best when K is small.
- `gather`: the |E| active experts gathered per row; cheapest when rows differ and K is large.
- `grouped`: (token, expert) pairs sorted by expert and run through `jax.lax.ragged_dot`.
- `merged`: the whole batch shares row 0's route: the delta is folded into W once per call.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

KERNELS = ("dense", "gather", "grouped", "merged", "auto")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Routes:
  idx: jax.Array  # [b, e] int32 expert ids
  w: jax.Array  # [b, e] float32 weights (0 for padding slots)

  def dense(self, num_experts: int) -> jax.Array:
    """The mixture as [b, K] weights."""
    rows = jnp.arange(self.idx.shape[0])[:, None]
    return jnp.zeros((self.idx.shape[0], num_experts), jnp.float32).at[rows, self.idx].add(self.w)


@functools.partial(jax.tree_util.register_dataclass, data_fields=("experts", "routes"),
                   meta_fields=("layers", "scale", "kernel"))
@dataclasses.dataclass(frozen=True)
class Adapter:
  """What `forward` needs to run the experts: weights, per-row routes, and static settings."""

  experts: dict  # target -> ExpertWeights (a [la, K, d, r], b [la, K, r, o])
  routes: Routes
  layers: tuple[int, ...]  # adapted layer indices, sorted (LoraConfig.adapted_layers)
  scale: float  # alpha / r
  kernel: str = "dense"

  def __post_init__(self):
    if self.kernel not in KERNELS:
      raise ValueError(f"Adapter.kernel: unknown mixture kernel {self.kernel!r} "
                       f"(known: {KERNELS})")

  def for_layer(self, layer: int):
    """This layer's {target: (a [K,d,r], b [K,r,o])}, or None when it is not adapted."""
    if layer not in self.layers:
      return None
    slot = self.layers.index(layer)
    return {t: (e.a[slot], e.b[slot]) for t, e in self.experts.items()}

  def project(self, x, w, bias, weights):
    """llm.model.Adapter: x through w (+ bias) plus this layer's mixture (weights = (a, b))."""
    return adapted_linear(x, w, bias, *weights, self.routes, self.scale, self.kernel)

  def delta(self, x, weights):
    """llm.model.Adapter: this layer's scaled mixture alone, [b, t, o] float32."""
    return self.scale * mixture_delta(x, *weights, self.routes, self.kernel)

  @property
  def row_data(self) -> Routes:
    return self.routes

  def map_rows(self, fn) -> "Adapter":
    return dataclasses.replace(self, routes=jax.tree.map(fn, self.routes))

  def stacked_over(self, num_layers: int):
    """{target: (a, b)} with a leading axis over all layers (zeros where not adapted), for scan."""
    rows = jnp.asarray(self.layers)
    out = {}
    for t, e in self.experts.items():
      a = jnp.zeros((num_layers,) + e.a.shape[1:], e.a.dtype).at[rows].set(e.a)
      b = jnp.zeros((num_layers,) + e.b.shape[1:], e.b.dtype).at[rows].set(e.b)
      out[t] = (a, b)
    return out


def uniform_routes(expert_sets, width: int | None = None) -> Routes:
  """Routes from Python lists of expert ids: weights 1/|E|, padded to `width` with weight 0."""
  width = width or max(len(s) for s in expert_sets)
  idx = np.zeros((len(expert_sets), width), np.int32)
  w = np.zeros((len(expert_sets), width), np.float32)
  for row, experts in enumerate(expert_sets):
    if not 0 < len(experts) <= width:
      raise ValueError(f"route {row} has {len(experts)} experts; need 1..{width}")
    idx[row, :len(experts)] = experts
    w[row, :len(experts)] = 1.0 / len(experts)
  return Routes(jnp.asarray(idx), jnp.asarray(w))


def _base(x, w, bias):
  y = jnp.einsum("btd,od->bto", x, w, preferred_element_type=jnp.float32)
  return y if bias is None else y + bias


def _dense(x, a, b, routes: Routes):
  mix = routes.dense(a.shape[0])  # [b, K]
  xa = jnp.einsum("btd,kdr->btkr", x, a, preferred_element_type=jnp.float32)  # [b, t, K, r]
  xa = (xa * mix[:, None, :, None]).astype(b.dtype)
  return jnp.einsum("btkr,kro->bto", xa, b, preferred_element_type=jnp.float32)


def _gather(x, a, b, routes: Routes):
  a_rows, b_rows = a[routes.idx], b[routes.idx]  # [b, e, d, r], [b, e, r, o]
  xa = jnp.einsum("btd,bedr->bter", x, a_rows, preferred_element_type=jnp.float32)
  xa = (xa * routes.w[:, None, :, None]).astype(b.dtype)
  return jnp.einsum("bter,bero->bto", xa, b_rows, preferred_element_type=jnp.float32)


def _grouped(x, a, b, routes: Routes):
  bsz, t, d = x.shape
  e = routes.idx.shape[1]
  num_experts = a.shape[0]
  expert = jnp.broadcast_to(routes.idx[:, None, :], (bsz, t, e)).reshape(-1)  # [n]
  weight = jnp.broadcast_to(routes.w[:, None, :], (bsz, t, e)).reshape(-1)
  token = jnp.broadcast_to(jnp.arange(bsz * t).reshape(bsz, t, 1), (bsz, t, e)).reshape(-1)
  order = jnp.argsort(expert, stable=True)
  sizes = jnp.bincount(expert, length=num_experts).astype(jnp.int32)
  xs = x.reshape(bsz * t, d)[token[order]]  # [n, d], grouped by expert
  xa = jax.lax.ragged_dot(xs, a, sizes, preferred_element_type=jnp.float32)  # [n, r]
  xa = (xa * weight[order][:, None]).astype(b.dtype)
  ys = jax.lax.ragged_dot(xa, b, sizes, preferred_element_type=jnp.float32)  # [n, o]
  out = jnp.zeros((bsz * t, ys.shape[-1]), jnp.float32).at[token[order]].add(ys)
  return out.reshape(bsz, t, -1)


def _auto_delta(x, a, b, routes: Routes):
  """`pick_kernel`'s choice, made for the platform lowered for: a TPU export made on this CPU
  gets the accelerator's kernel, not the host's."""
  shapes = x.shape[1], a.shape[0], routes.idx.shape[1]
  # pick_kernel tells only CPU from accelerators: "tpu" stands for every accelerator
  on_cpu, elsewhere = pick_kernel(*shapes, backend="cpu"), pick_kernel(*shapes, backend="tpu")
  delta = lambda kernel: lambda x, a, b, routes: mixture_delta(x, a, b, routes, kernel)
  if on_cpu == elsewhere:
    return delta(on_cpu)(x, a, b, routes)
  return jax.lax.platform_dependent(x, a, b, routes, cpu=delta(on_cpu), default=delta(elsewhere))


def mixture_delta(x, a, b, routes: Routes, kernel: str):
  """The unscaled per-row mixture x -> [b, t, o] float32 by a per-row kernel. "merged" folds its
  delta into the frozen weight, which a fused decode layer does not hold apart; its rows share
  one route, so `gather` gives the same delta."""
  if kernel == "auto":
    return _auto_delta(x, a, b, routes)
  if kernel == "merged":
    kernel = "gather"
  if kernel not in ("dense", "gather", "grouped"):
    raise ValueError(f"unknown mixture kernel {kernel!r} (known: {KERNELS})")
  return {"dense": _dense, "gather": _gather, "grouped": _grouped}[kernel](x, a, b, routes)


def adapted_linear(x, w, bias, a, b, routes: Routes, scale: float, kernel: str):
  """x [b,t,d], w [o,d], bias [o] or None, a [K,d,r], b [K,r,o] -> [b,t,o] in x.dtype.

  kernel "auto" picks among the per-row kernels from the (static) shapes, for the platform
  lowered for (`_auto_delta`).
  """
  if kernel == "merged":
    # One [d, E*r] x [E*r, o] product: a 3-operand einsum can materialise [e, d, r, o].
    a_cat = a[routes.idx[0]] * routes.w[0][:, None, None].astype(a.dtype)  # [e, d, r]
    a_cat = a_cat.transpose(1, 0, 2).reshape(a.shape[1], -1)
    b_cat = b[routes.idx[0]].reshape(-1, b.shape[-1])  # [e*r, o]
    delta = jnp.einsum("dk,ko->od", a_cat, b_cat, preferred_element_type=jnp.float32)
    y = _base(x, (w.astype(jnp.float32) + scale * delta).astype(w.dtype), bias)
  else:
    y = _base(x, w, bias) + scale * mixture_delta(x, a, b, routes, kernel)
  return y.astype(x.dtype)


def reference_delta(x, a, b, routes: Routes, scale: float):
  """The plain per-row, per-expert loop that every kernel must match (tests, benchmarks)."""
  idx, w = np.asarray(routes.idx), np.asarray(routes.w)  # concrete routes: the loop unrolls
  rows = []
  for row in range(x.shape[0]):
    acc = jnp.zeros((x.shape[1], b.shape[-1]), jnp.float32)
    for slot in range(idx.shape[1]):
      k = int(idx[row, slot])
      acc = acc + float(w[row, slot]) * ((x[row] @ a[k]) @ b[k])
    rows.append(scale * acc)
  return jnp.stack(rows)


def pick_kernel(tokens_per_row: int, num_experts: int, route_width: int, backend: str) -> str:
  """A per-row kernel from static shapes on `backend` ("cpu" or an accelerator's name;
  `benchmarks.mixture` measures the real choice).

  `dense` computes every expert but needs no gather: best while K is at most twice the route
  width (the default 6 experts, routes of 3). `gather` wins for larger K. `grouped` uses
  ragged_dot, which XLA:CPU emulates slowly (measured 2.4x the dense kernel), so only on
  accelerators and long rows.
  """
  if backend != "cpu" and tokens_per_row >= 256 and num_experts > 2 * route_width:
    return "grouped"
  return "dense" if num_experts <= 2 * route_width else "gather"
