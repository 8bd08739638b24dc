"""Logical-axis sharding: one `ShardingRules` maps named tensor axes to the ('data', 'model') mesh.

Weights are split Megatron-style over `model` (heads, kv heads, mlp, vocab); rows over `data`.
A logical axis whose size the mesh axis does not divide stays replicated rather than failing.
Every array declares its logical axes once: the backbone's in `llm.params.WEIGHTS`, the cache's
in `CACHE_AXES`, the LoRA experts' and the router's beside them (`lora.experts.expert_axes`,
`lora.router.ROUTER_AXES`); `shardings` / `shard` apply the rules to any such pair of trees.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from morse_jax.llm.model import KVCache
from morse_jax.llm.params import WEIGHTS, Params

CACHE_AXES = KVCache(k=("layers", "batch", "kv_heads", "sequence", "head_dim"),
                     v=("layers", "batch", "kv_heads", "sequence", "head_dim"),
                     valid=("batch", "sequence"), length=(), next_pos=("batch",))


@dataclasses.dataclass(frozen=True)
class ShardingRules:
  """Logical axis name -> mesh axis name (or None for replicated)."""

  batch: str | None = "data"
  sequence: str | None = None
  embed: str | None = None
  heads: str | None = "model"
  kv_heads: str | None = "model"
  head_dim: str | None = None
  mlp: str | None = "model"
  vocab: str | None = "model"
  layers: str | None = None
  experts: str | None = None  # LoRA experts, the router's prototypes
  lora_rank: str | None = None
  router: str | None = None  # the router's projection width

  def spec(self, logical: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for an array (None names a replicated axis); axes the mesh axis does not divide evenly stay replicated."""
    out = []
    for name, size in zip(logical, shape):
      if name is None:
        out.append(None)
        continue
      if name not in LOGICAL_AXES:
        raise ValueError(f"unknown logical axis {name!r} (known: {LOGICAL_AXES})")
      axis = getattr(self, name)
      if axis is not None and axis not in mesh.shape:
        raise ValueError(f"ShardingRules.{name} = {axis!r} is not a mesh axis {tuple(mesh.shape)}")
      out.append(axis if axis is not None and size % mesh.shape[axis] == 0 else None)
    return PartitionSpec(*out)

  def sharding(self, logical, shape, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, self.spec(tuple(logical), tuple(shape), mesh))


def make_mesh(data: int, model: int = 1, devices=None) -> Mesh:
  """A ('data', 'model') mesh with Auto axis types (jax.make_mesh defaults to Explicit)."""
  devices = jax.devices() if devices is None else devices
  if data * model > len(devices):
    raise ValueError(f"mesh {data}x{model} needs {data * model} devices, have {len(devices)}")
  grid = np.asarray(devices[:data * model]).reshape(data, model)
  return Mesh(grid, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


LOGICAL_AXES = tuple(f.name for f in dataclasses.fields(ShardingRules))
PARAM_AXES = jax.tree.map(lambda w: w.axes, WEIGHTS)  # a Params of axis-name tuples


def shardings(tree, axes, mesh: Mesh, rules: ShardingRules = ShardingRules()):
  """NamedShardings for the arrays (or abstract arrays) of `tree`, from `axes`: the same tree with
  a tuple of logical axis names where `tree` has an array (None stays None)."""
  return jax.tree.map(lambda a, ax: None if a is None else rules.sharding(ax, a.shape, mesh),
                      tree, axes, is_leaf=lambda x: x is None)


def shard(tree, axes, mesh: Mesh, rules: ShardingRules = ShardingRules()):
  """`tree` placed on `mesh` by `shardings`."""
  return jax.tree.map(lambda a, s: None if a is None else put(a, s), tree,
                      shardings(tree, axes, mesh, rules), is_leaf=lambda x: x is None)


def param_shardings(params: Params, mesh: Mesh, rules: ShardingRules = ShardingRules()):
  return shardings(params, PARAM_AXES, mesh, rules)


def put(x, sharding: NamedSharding) -> jax.Array:
  """device_put that also works when the mesh spans other processes: each process then builds
  its own shards from its copy of the full value (every process holds the same one)."""
  if sharding.is_fully_addressable:
    return jax.device_put(x, sharding)
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys travel as their data
    return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding),
                                    impl=jax.random.key_impl(x))
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_params(params: Params, mesh: Mesh, rules: ShardingRules = ShardingRules()) -> Params:
  return shard(params, PARAM_AXES, mesh, rules)


def cache_shardings(cache: KVCache, mesh: Mesh, rules: ShardingRules = ShardingRules()):
  return jax.tree.map(lambda a, ax: rules.sharding(ax, a.shape, mesh), cache, CACHE_AXES,
                      is_leaf=lambda x: isinstance(x, tuple))


def shard_rows(mesh: Mesh, rules: ShardingRules = ShardingRules()):
  """A callable placing arrays with rows on axis 0 over the batch axis (for `sample`)."""

  def place(*arrays):
    return tuple(put(a, rules.sharding(("batch",) + (None,) * (a.ndim - 1), a.shape, mesh))
                 if a.ndim else a for a in arrays)

  return place


def to_host(tree):
  """Device arrays -> numpy on every process. Arrays spread over other processes' devices are
  gathered (replicated ones are read from a local copy); plain device_get cannot fetch them."""
  from jax.experimental import multihost_utils

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree.map(get, tree)
