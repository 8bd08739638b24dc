"""The C++ CPU kernels (XLA FFI custom calls), built on first use with the machine's compiler.

`cpu_attention` (the engine's decode attention over pages, `paged_attention_cpu.cc`) and
`cpu_matmul` (a decode step's few-row weight products, `skinny_matmul_cpu.cc`) each run a kernel
on a CPU backend and keep their plain-JAX path everywhere else. The sources (with the headers
`cpu_parallel.h`, threads, and `cpu_vector.h`, 16-lane vectors) are compiled together, once per
source, compiler and CPU (`-O3 -march=native`), into `~/.cache/morse_jax/kernels` (`MORSE_KERNEL_CACHE` overrides), loaded with
ctypes, and every handler in `TARGETS` is registered for the cpu platform. Where no compiler is
found or the build fails, or `MORSE_CPU_KERNELS=0`, `available()` is False (the reason in
`unavailable_reason()`, logged once) and the JAX paths run: slower, the same numbers up to float
summation order.
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

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = (_HERE / "paged_attention_cpu.cc", _HERE / "skinny_matmul_cpu.cc")
HEADERS = (_HERE / "cpu_parallel.h", _HERE / "cpu_vector.h")
# custom-call target name -> the library's handler symbol
TARGETS = {
    "morse_paged_attention_f32": "PagedAttentionF32",
    "morse_paged_attention_bf16": "PagedAttentionBF16",
    "morse_paged_attention_bf16_bits": "PagedAttentionBF16Bits",
    "morse_skinny_matmul_f32": "SkinnyMatmulF32",
    "morse_skinny_matmul_bf16": "SkinnyMatmulBF16",
    "morse_skinny_matmul_layer_f32": "SkinnyMatmulLayerF32",
    "morse_skinny_matmul_layer_bf16": "SkinnyMatmulLayerBF16",
    "morse_skinny_matmul_bf16x": "SkinnyMatmulBF16X",
    "morse_skinny_matmul_layer_bf16x": "SkinnyMatmulLayerBF16X",
}
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
  flags = ["-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", f"-I{_HERE}",
           f"-I{jax.ffi.include_dir()}"]
  texts = [p.read_text() for p in SOURCES + HEADERS]
  digest = hashlib.sha256("\n".join([*texts, version, _cpu_tag(), " ".join(flags),
                                     jax.__version__]).encode()).hexdigest()[:16]
  target = _cache_dir() / f"morse_cpu_kernels_{digest}.so"
  if target.exists():
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    built = Path(tmp) / target.name
    run = subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(built)],
                         capture_output=True, text=True)
    if run.returncode:
      raise RuntimeError(f"{compiler} failed ({run.returncode}): {run.stderr[-2000:]}")
    os.replace(built, target)  # atomic: a concurrent build never leaves half a library
  return target


def _load() -> None:
  if os.environ.get("MORSE_CPU_KERNELS", "1") == "0":
    raise RuntimeError("MORSE_CPU_KERNELS=0")
  lib = ctypes.cdll.LoadLibrary(str(_build()))
  for name, symbol in TARGETS.items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  _state["lib"] = lib  # the handlers live in it: it must not be unloaded


def available() -> bool:
  """Whether the kernels are built and registered (builds them on the first call)."""
  if "ok" not in _state:
    try:
      _load()
      _state["ok"] = True
    except Exception as e:  # noqa: BLE001 - any failure leaves the JAX paths in place
      _state["ok"], _state["reason"] = False, f"{type(e).__name__}: {e}"
      log.warning("CPU kernels unavailable, the JAX paths run instead: %s", _state["reason"])
  return _state["ok"]


def unavailable_reason() -> str | None:
  return None if available() else _state["reason"]
