"""What a process's numbers depend on beyond its config, set before JAX starts its backend:
JAX's persistent compilation cache and XLA:CPU's intra-op thread count; and `describe()`, the
record of both with the CPU that the run's metadata keeps. Shared by every system's pipeline."""

import os

import jax
from absl import logging
from jax._src import xla_bridge


def use_compilation_cache(config) -> None:
  """Points JAX's persistent cache at config.compilation_cache (before the first compile)."""
  path = config.get("compilation_cache", "")
  if path:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))


# XLA:CPU splits a large reduction (a loss; a weight's gradient over batch x tokens) over its
# intra-op thread pool, a partial sum per thread, so the same program on another number of cores
# ends in other last bits, and sampled training turns those into other tokens (docs/RESULTS.md,
# "Reproducible runs"). XLA sizes the pool by PJRT_NPROC when set, else by the schedulable cores.
_POOL_ENV = "PJRT_NPROC"


def use_cpu_threads(config) -> None:
  """Sizes XLA:CPU's intra-op thread pool to config.cpu_threads (0 or absent: XLA's default, a
  thread per schedulable core) before JAX starts its CPU backend, so that the run's numbers are
  the same on a machine with another number of cores. A backend already started keeps its pool
  (a warning says so): call this before anything touches a device."""
  n = config.get("cpu_threads", 0)
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ValueError(f"config.cpu_threads must be an integer >= 0, got {n!r}")
  if not n or os.environ.get(_POOL_ENV) == str(n):
    return
  if xla_bridge.backends_are_initialized():
    logging.warning("config.cpu_threads=%d not applied: JAX's CPU backend already runs with %d "
                    "intra-op threads", n, cpu_threads())
    return
  os.environ[_POOL_ENV] = str(n)


def cpu_threads() -> int:
  """The intra-op threads XLA:CPU sizes its pool to in this process (as xla/pjrt/cpu reads them:
  PJRT_NPROC, else NPROC, else the schedulable cores)."""
  for name in (_POOL_ENV, "NPROC"):
    value = os.environ.get(name, "")
    if value.strip().lstrip("-").isdigit():
      return max(0, int(value))
  return len(os.sched_getaffinity(0))


# The instruction sets XLA:CPU and its kernel libraries choose code by (of /proc/cpuinfo's flags)
_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
              "avx512_fp16", "avx_vnni", "amx_tile")


def describe() -> dict:
  """What a run's last bits depend on beyond its config: JAX's version, XLA:CPU's thread count,
  the CPU and the instruction sets its kernels were chosen by."""
  info = {}
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
  flags = set(info.get("flags", "").split())
  return {"jax": jax.__version__, "cpu_threads": cpu_threads(), "cpu": info.get("model name", ""),
          "isa": [f for f in _ISA_FLAGS if f in flags]}
