"""Multi-process start-up: one Python process per host (TPU pod slice) or per GPU node.

Every process runs the same program. Arrays that span all devices are built from each process's
rows (`global_rows`), and the jitted step reduces across hosts by itself.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from morse_jax.llm.sharding import to_host  # noqa: F401  (re-exported: part of this API)

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _int(name: str, value) -> int | None:
  if value is None or value == "":
    return None
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ValueError(f"distributed: {name}={value!r} is not an integer") from None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> bool:
  """Joins the job's processes; returns whether a multi-process runtime was started.

  Arguments come from the caller (launcher flags), else from the environment variables
  JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID. With none of them set, `auto`
  lets JAX detect the cluster (Cloud TPU, SLURM, Open MPI, Kubernetes); without `auto` the run
  stays single-process. On CPU the cross-process collectives use gloo.
  """
  address = coordinator_address or os.environ.get(ENV[0]) or None
  count = num_processes if num_processes is not None else _int(ENV[1], os.environ.get(ENV[1]))
  index = process_id if process_id is not None else _int(ENV[2], os.environ.get(ENV[2]))
  given = [v is not None for v in (address, count, index)]
  if any(given) and not all(given):
    missing = [name for name, g in zip(("coordinator_address", "num_processes", "process_id"),
                                       given) if not g]
    raise ValueError(f"distributed: {', '.join(missing)} missing (set the flags or {ENV})")
  if count is not None and not 0 <= index < count:
    raise ValueError(f"distributed: process_id={index} is outside [0, num_processes={count})")
  if not any(given) and not auto:
    return False
  if count == 1:
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(address, count, index)
  return True


def global_rows(mesh: Mesh, local: np.ndarray, axis: str = "data") -> jax.Array:
  """The global [rows, ...] array whose rows are the concatenation of every process's `local`
  rows (in process order), sharded over `axis`."""
  spec = PartitionSpec(axis, *([None] * (np.ndim(local) - 1)))
  return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), np.asarray(local))
