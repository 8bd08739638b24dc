"""GFLOP/s of one decode projection on this backend: f32, bf16 -> bf16 and bf16 with f32
accumulation, at several row counts, and the bf16 product inside a scan over stacked weights
(as `model.forward` runs the layers) against the same product over separate arrays.

  python -m benchmarks.cpu_matmul [--rows=8,32,128] [--k=1536] [--n=8960] [--layers=4]

The default shape is Qwen2.5-Coder-1.5B's gate (1536 -> 8960). Why it exists: it is where the
decode step's products should run (RESULTS, Qwen2.5-Coder: "Speed against transformers").
"""

from __future__ import annotations

from absl import app, flags

from benchmarks.common import median_seconds

_ROWS = flags.DEFINE_list("rows", ["8", "32", "128"], "Rows (tokens) per product.")
_K = flags.DEFINE_integer("k", 1536, "Input width.")
_N = flags.DEFINE_integer("n", 8960, "Output width.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Stacked weights of the scan case.")


def _seconds(fn, *args, repeats: int = 10) -> float:
  """Median seconds of one call, after a first (compiling) one."""
  import jax
  run = lambda: jax.block_until_ready(fn(*args))
  run()
  return median_seconds(run, repeats)


def measure(rows: int, k: int, n: int, layers: int) -> dict:
  """GFLOP/s per case for one row count."""
  import jax
  import jax.numpy as jnp

  flop = 2 * rows * k * n
  out = {}
  for name, dtype, acc in (("f32", jnp.float32, None), ("bf16_out_bf16", jnp.bfloat16, None),
                           ("bf16_acc_f32", jnp.bfloat16, jnp.float32)):
    x, w = jnp.ones((rows, k), dtype), jnp.ones((n, k), dtype)  # w [out, in], as stored
    dot = jax.jit(lambda x, w, acc=acc: jnp.einsum("td,od->to", x, w, preferred_element_type=acc))
    out[name] = flop / _seconds(dot, x, w) / 1e9

  def layer(h, w):
    y = jnp.einsum("td,od->to", h, w, preferred_element_type=jnp.float32)
    return h + y[:, :k].astype(h.dtype)

  x = jnp.ones((rows, k), jnp.bfloat16)
  stacked = jnp.ones((layers, n, k), jnp.bfloat16)
  separate = [jnp.ones((n, k), jnp.bfloat16) for _ in range(layers)]
  bits = jax.lax.bitcast_convert_type(stacked, jnp.uint16)  # as `model.bits_view` stores them
  scan = jax.jit(lambda x, b: jax.lax.scan(
      lambda h, w: (layer(h, jax.lax.bitcast_convert_type(w, jnp.bfloat16)), None), x, b)[0])

  def loop(x, ws):
    for w in ws:
      x = layer(x, w)
    return x

  out["bf16_scan_stacked"] = layers * flop / _seconds(scan, x, bits) / 1e9
  out["bf16_separate_arrays"] = layers * flop / _seconds(jax.jit(loop), x, separate) / 1e9
  return out


def main(argv):
  del argv
  for rows in map(int, _ROWS.value):
    r = measure(rows, _K.value, _N.value, _LAYERS.value)
    print(f"{rows:4d} rows: " + "  ".join(f"{k} {v:6.1f}" for k, v in r.items()) + "  GFLOP/s")


if __name__ == "__main__":
  app.run(main)
