"""The blocked attention's block size on this machine: forward + backward of the attention op
(d/d q, k, v of sum(out^2)) at each --blocks (query and key block alike; sizes that do not
divide t are padded / shifted as `llm.attention` does) against the dense formula, all programs
timed in turn in one process (median of --rounds rounds).

  python -m benchmarks.attention_blocks --shapes=32x768,16x1024,4x3072 --blocks=512,256,128 [--report FILE]

q [b, t, 4, 64], k / v [b, 2, t, 64] (the demo toy's heads), causal, f32. The model's default
(`attention.BLOCK_Q` / `BLOCK_K`, with `block_size` picking a divisor) came from this run.
"""

from __future__ import annotations

import time

from absl import app, flags

from benchmarks.attention import dense_attention
from benchmarks.common import write_report

_SHAPES = flags.DEFINE_list("shapes", ["32x768", "16x1024", "4x3072"], "rows x tokens")
_BLOCKS = flags.DEFINE_list("blocks", ["512", "256", "128"], "Block sizes to time.")
# benchmarks.attention (imported for its dense formula) owns --repeats and --out
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Rounds (each program once per round).")
_REPORT = flags.DEFINE_string("report", None, "JSON report.")


def programs(b: int, t: int, blocks):
  """{name: jitted gradient}, and its arguments."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from morse_jax.llm import attention

  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(b, t, 4, 64)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(b, 2, t, 64)), jnp.float32) for _ in range(2))
  vis = attention.Visibility(0, jnp.ones((b, t), bool))
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2), argnums=(0, 1, 2)))
  out = {"dense": grad(lambda q, k, v: dense_attention(q, k, v, vis))}
  for n in blocks:
    out[f"blocks_{n}"] = grad(lambda q, k, v, n=n: attention.attention(
        q, k, v, vis, attention.Blocks(q=n, k=n)))
  return out, (q, k, v)


def main(argv):
  del argv
  import jax

  rows = []
  for shape in _SHAPES.value:
    b, t = (int(x) for x in shape.split("x"))
    fns, args = programs(b, t, [int(n) for n in _BLOCKS.value])
    for fn in fns.values():
      jax.block_until_ready(fn(*args))  # compiled, untimed
    times = {name: [] for name in fns}
    for _ in range(_ROUNDS.value):
      for name, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times[name].append(time.perf_counter() - start)
    for name, ts in times.items():
      ms = sorted(ts)[len(ts) // 2] * 1e3
      rows.append({"rows": b, "tokens": t, "program": name, "ms": round(ms, 1)})
      print(f"{b:3d} x {t:5d}  {name:12s} {ms:8.1f} ms", flush=True)
  write_report("attention_blocks", _REPORT.value, device=jax.devices()[0].device_kind, results=rows)


if __name__ == "__main__":
  app.run(main)
