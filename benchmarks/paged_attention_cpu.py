"""The engine's decode attention over pages on CPU: the C++ kernel (`llm/cpu_attention.py`)
against the plain-JAX loop it replaces (`paged.paged_attention_loop`), in one process.

One layer's attention for one new token a row: 16 rows, contexts drawn in [ctx / 2, ctx), each
row's pages scattered over a pool of `--pool_pages` pages (the chat server's 4097 by default:
as in the engine, the pages a call reads are not in cache), at the toy's shape (3 query heads
on 1 kv head of 64) and SmolLM2's (9 on 3 of 64). Reports milliseconds per call, the ratio, the bytes of k and v the
rows see per millisecond (the physical floor is the machine's memory bandwidth, ~27 GB/s copy
here) and the largest difference.

  python -m benchmarks.paged_attention_cpu --out=benchmarks/results/paged_attention_cpu.json
"""

from __future__ import annotations

import functools
import time

from absl import app, flags

SHAPES = {"toy": (3, 1, 64), "smollm2": (9, 3, 64)}  # query heads, kv heads, head dim


def _timed(fn, args, repeats: int) -> tuple:
  import jax

  out = jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(3):  # best of 3 runs of `repeats` calls: other processes only slow a run down
    start = time.perf_counter()
    for _ in range(repeats):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / repeats)
  return out, best * 1e3


def _case(rows, heads, kv, dim, ctx, pool_pages=0, page=16, seed=0):
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(seed)
  per_row = -(-ctx // page)
  size = max(pool_pages, rows * per_row + 1)
  pool = lambda: jnp.asarray(rng.standard_normal((size, kv, page, dim)), jnp.float32)
  pages = 1 + rng.permutation(size - 1)[:rows * per_row].reshape(rows, per_row)
  pages = jnp.asarray(pages, jnp.int32)
  kv_len = jnp.asarray(rng.integers(ctx // 2, ctx, rows), jnp.int32)
  q = jnp.asarray(rng.standard_normal((rows, 1, heads, dim)), jnp.float32)
  return (q, pool(), pool(), pages, kv_len[:, None] - 1, kv_len), int(kv_len.sum())


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  from benchmarks.common import write_report
  from morse_jax.llm import cpu_attention, paged

  if not cpu_attention.available():
    raise SystemExit(f"the kernel is not built here: {cpu_attention.unavailable_reason()}")
  loop = jax.jit(functools.partial(paged.paged_attention_loop, block_pages=16))
  kernel = jax.jit(cpu_attention.attend)
  cases = []
  for name, (heads, kv, dim) in SHAPES.items():
    for ctx in map(int, FLAGS.contexts):
      args, keys = _case(FLAGS.rows, heads, kv, dim, ctx, FLAGS.pool_pages)
      want, t_loop = _timed(loop, args, FLAGS.repeats)
      got, t_kernel = _timed(kernel, args, FLAGS.repeats)
      seen = keys * kv * dim * 4 * 2  # k and v bytes the rows see
      case = {"shape": name, "rows": FLAGS.rows, "context_below": ctx, "loop_ms": t_loop,
              "kernel_ms": t_kernel, "ratio": t_loop / t_kernel,
              "kernel_gb_per_s": seen / t_kernel / 1e6, "loop_gb_per_s": seen / t_loop / 1e6,
              "max_abs_diff": float(jnp.max(jnp.abs(got - want)))}
      cases.append(case)
      print(f"{name} ctx<{ctx}: loop {t_loop:.3f} ms, kernel {t_kernel:.3f} ms "
            f"({case['ratio']:.1f}x; {case['kernel_gb_per_s']:.1f} against "
            f"{case['loop_gb_per_s']:.1f} GB/s of k / v seen), max diff "
            f"{case['max_abs_diff']:.1e}", flush=True)
  write_report("paged_attention_cpu", FLAGS.out, cases=cases)


if __name__ == "__main__":
  flags.DEFINE_integer("rows", 16, "Rows (one new token each).")
  flags.DEFINE_list("contexts", ["460", "1200"], "Context bounds: lengths drawn in [c / 2, c).")
  flags.DEFINE_integer("repeats", 50, "Calls per timed run.")
  flags.DEFINE_integer("pool_pages", 4097, "Pages in the pool the rows' pages are drawn from.")
  flags.DEFINE_string("out", None, "Write the report as JSON to this file.")
  FLAGS = flags.FLAGS
  app.run(main)
