"""A decode token's weight products on CPU: the C++ kernel (`llm/cpu_matmul.py`) against XLA's
dot, in one process, and against the floor of reading the weights once.

Every layer's products for one new token a row (q, k, v, o, gate, up, down, chained as a layer
chains them) and the output head, with random weights at a model's shapes:

- `smollm2`: SmolLM2-135M's, float32, per-layer [out, in] arrays as the engine's fused decode
  layout holds them (q / k / v and gate / up fused: 4 products a layer): XLA's einsum on each
  (`xla`) against the kernel (`kernel`).
- `qwen25_coder_15b`: Qwen2.5-Coder-1.5B's, bfloat16, stacked over the layers as stored (too
  large for the fused copy): XLA's einsum on each layer's slice of the stack (`xla`, what the
  stored decode ran before the kernel) against the kernel reading layer i of the stack in place
  (`kernel`, `cpu_matmul.layer_kernel`).

`floor_ms`: the weights' bytes over the machine's read bandwidth, measured here as XLA's sum over
a float32 array of 512 MiB. Reports ms per token for each row count and the ratio.

  python -m benchmarks.decode_matmul_cpu --out=benchmarks/results/decode_matmul_cpu.json
"""

from __future__ import annotations

import time

from absl import app, flags

# hidden, q width, kv width, intermediate, layers, vocab, dtype
SHAPES = {"smollm2": (576, 576, 192, 1536, 30, 49152, "float32"),
          "qwen25_coder_15b": (1536, 1536, 256, 8960, 28, 151936, "bfloat16")}


def _best_ms(fn, *args, repeats: int = 3) -> float:
  import jax

  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):  # other processes only slow a run down
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best * 1e3


def _read_gb_per_s() -> float:
  import jax
  import jax.numpy as jnp

  a = jnp.ones((1 << 27,), jnp.float32)
  return a.nbytes / _best_ms(jax.jit(jnp.sum), a, repeats=5) / 1e6


def _programs(shape):
  """(xla, kernel, weights, head): one decode token's products each way."""
  import jax
  import jax.numpy as jnp

  from morse_jax.llm import cpu_matmul

  d, q, kv, f, layers, vocab, dtype = shape
  dtype = jnp.dtype(dtype)
  key = jax.random.key(0)
  shapes = {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q), "gate": (f, d), "up": (f, d),
            "down": (d, f)}
  stacked = {n: (0.02 * jax.random.normal(jax.random.fold_in(key, i), (layers,) + s)).astype(dtype)
             for i, (n, s) in enumerate(shapes.items())}
  head = (0.02 * jax.random.normal(key, (vocab, d))).astype(dtype)

  def chain(x, mm):  # one token through the layers' products, as a layer chains them
    for i in range(layers):
      if fused:
        a = mm(x, "qkv", i)[..., :q]
        gate, up = jnp.split(mm(x, "gate_up", i), 2, axis=-1)
      else:
        a = mm(x, "q", i) + 0 * (mm(x, "k", i)[..., :1] + mm(x, "v", i)[..., :1])
        gate, up = mm(x, "gate", i), mm(x, "up", i)
      x = x + mm(a.astype(dtype), "o", i).astype(dtype)
      x = x + mm((jax.nn.silu(gate) * up).astype(dtype), "down", i).astype(dtype)
    return x

  fused = dtype == jnp.float32
  if fused:  # per-layer arrays, q / k / v and gate / up rows side by side: the fused layout
    per_layer = lambda *names: tuple(jnp.concatenate([stacked[n][i] for n in names])
                                     for i in range(layers))
    weights = {"qkv": per_layer("q", "k", "v"), "o": per_layer("o"),
               "gate_up": per_layer("gate", "up"), "down": per_layer("down")}
    kernel = lambda x, w, h: cpu_matmul.kernel(chain(x, lambda x, n, i: cpu_matmul.kernel(
        x, w[n][i])), h)
  else:  # the stack as stored
    weights = stacked
    kernel = lambda x, w, h: cpu_matmul.kernel(chain(x, lambda x, n, i: cpu_matmul.layer_kernel(
        x, w[n], i)), h)
  # XLA on each layer's array (fused) or on each slice of the stack (stored)
  xla = lambda x, w, h: cpu_matmul.reference(chain(x, lambda x, n, i: cpu_matmul.reference(
      x, w[n][i])), h)
  return jax.jit(xla), jax.jit(kernel), weights, head


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  from benchmarks.common import write_report
  from morse_jax.llm import cpu_kernels

  if not cpu_kernels.available():
    raise SystemExit(f"the kernels are not built here: {cpu_kernels.unavailable_reason()}")
  read = _read_gb_per_s()
  print(f"read bandwidth (XLA sum of 512 MiB): {read:.1f} GB/s", flush=True)
  cases = []
  for name in FLAGS.models:
    xla, kernel, weights, head = _programs(SHAPES[name])
    nbytes = sum(a.nbytes for a in jax.tree.leaves(weights)) + head.nbytes
    for rows in map(int, FLAGS.rows):
      x = jnp.full((rows, 1, SHAPES[name][0]), 0.01, head.dtype)
      t_xla, t_kernel = _best_ms(xla, x, weights, head), _best_ms(kernel, x, weights, head)
      case = {"model": name, "rows": rows, "weight_gb": nbytes / 1e9, "xla_ms": t_xla,
              "kernel_ms": t_kernel, "ratio": t_xla / t_kernel, "floor_ms": nbytes / read / 1e6}
      cases.append(case)
      print(f"{name} rows {rows}: XLA {t_xla:.1f} ms, kernel {t_kernel:.1f} ms "
            f"({case['ratio']:.2f}x), floor {case['floor_ms']:.1f} ms", flush=True)
  write_report("decode_matmul_cpu", FLAGS.out, read_gb_per_s=read, cases=cases)


if __name__ == "__main__":
  flags.DEFINE_list("models", list(SHAPES), "Shapes to run.")
  flags.DEFINE_list("rows", ["1", "4", "8", "16", "32"], "Rows (one new token each).")
  flags.DEFINE_string("out", None, "Write the report as JSON to this file.")
  FLAGS = flags.FLAGS
  app.run(main)
