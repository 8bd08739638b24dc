"""The CPU kernel for the engine's decode attention over pages (`paged_attention_cpu.cc`, an XLA
FFI custom call), built on first use with the machine's C++ compiler.

`paged.paged_attention` calls `attend` for a pass of at most `MAX_QUERIES` queries a row on a
CPU backend (the engine's decode step: one token a row) and keeps its plain-JAX loop everywhere
else (prefill chunks are matrix products XLA runs well; TPU and GPU lower the JAX loop or their
own kernels). Why a kernel: XLA:CPU ran that loop at ~5 GB/s, gathering each block of pages once
per token; SmolLM2's decode step spent about three quarters of its time there (RESULTS, "The
engine's decode attention on CPU").

The library is compiled once per source, compiler and CPU (`-O3 -march=native`) into
`~/.cache/morse_jax/kernels` (`MORSE_KERNEL_CACHE` overrides) and loaded with ctypes. Where no
compiler is found or the build fails, or `MORSE_CPU_KERNELS=0`, `available()` is False (the
reason in `unavailable_reason()`, logged once) and the JAX loop runs: slower, the same numbers
up to float summation order.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention_cpu.cc")
MAX_QUERIES = 4  # queries a row up to which the kernel runs (decode: 1)
# pool dtype -> (the custom call's target name, the library's handler symbol)
_TARGETS = {jnp.dtype(jnp.float32): ("morse_paged_attention_f32", "PagedAttentionF32"),
            jnp.dtype(jnp.bfloat16): ("morse_paged_attention_bf16", "PagedAttentionBF16")}
_state: dict = {}


def _cache_dir() -> Path:
  root = os.environ.get("MORSE_KERNEL_CACHE")
  return Path(root) if root else Path.home() / ".cache" / "morse_jax" / "kernels"


def _cpu_tag() -> str:
  """The CPU's feature flags (a -march=native build runs only where they hold)."""
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("flags"):
        return line
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _build() -> Path:
  compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
  if compiler is None:
    raise RuntimeError("no C++ compiler found (g++ / c++ on PATH, or $CXX)")
  version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
  flags = ["-O3", "-march=native", "-std=c++17", "-fPIC", "-shared",
           f"-I{jax.ffi.include_dir()}"]
  digest = hashlib.sha256("\n".join([SOURCE.read_text(), version, _cpu_tag(), " ".join(flags),
                                     jax.__version__]).encode()).hexdigest()[:16]
  target = _cache_dir() / f"paged_attention_cpu_{digest}.so"
  if target.exists():
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    built = Path(tmp) / target.name
    run = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built)], capture_output=True,
                         text=True)
    if run.returncode:
      raise RuntimeError(f"{compiler} failed ({run.returncode}): {run.stderr[-2000:]}")
    os.replace(built, target)  # atomic: a concurrent build never leaves half a library
  return target


def _load() -> None:
  if os.environ.get("MORSE_CPU_KERNELS", "1") == "0":
    raise RuntimeError("MORSE_CPU_KERNELS=0")
  lib = ctypes.cdll.LoadLibrary(str(_build()))
  for name, symbol in _TARGETS.values():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  _state["lib"] = lib  # the handlers live in it: it must not be unloaded


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  if "ok" not in _state:
    try:
      _load()
      _state["ok"] = True
    except Exception as e:  # noqa: BLE001 - any failure leaves the JAX loop in place
      _state["ok"], _state["reason"] = False, f"{type(e).__name__}: {e}"
      log.warning("CPU paged-attention kernel unavailable, the JAX loop runs instead: %s",
                  _state["reason"])
  return _state["ok"]


def unavailable_reason() -> str | None:
  return None if available() else _state["reason"]


def takes(q, pool_k) -> bool:
  """Whether `attend` takes this pass: few queries a row, a pool dtype the kernel reads."""
  return (q.shape[1] <= MAX_QUERIES and jnp.dtype(pool_k.dtype) in _TARGETS
          and available())


def attend(q, pool_k, pool_v, pages, q_pos, kv_len):
  """`paged.paged_attention`'s result by the kernel: q [b, t, h, x], pool_k / pool_v
  [pages, kv, P, x], pages [b, n], q_pos [b, t], kv_len [b] -> [b, t, h, x] float32."""
  call = jax.ffi.ffi_call(_TARGETS[jnp.dtype(pool_k.dtype)][0],
                          jax.ShapeDtypeStruct(q.shape, jnp.float32))
  i32 = lambda a: jnp.asarray(a, jnp.int32)
  return call(q.astype(jnp.float32), pool_k, pool_v, i32(pages), i32(q_pos), i32(kv_len))

