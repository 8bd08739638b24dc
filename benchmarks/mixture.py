"""Mixture-of-LoRA kernels on the adapted q, v and o projections at Qwen3-4B shapes.

  python -m benchmarks.mixture [--out FILE] [--quick]

For each token count, 8 rows with different routes (role expert + 2 of 4 subtask experts, r 8,
alpha 16) run q (2560->4096), v (2560->1024) and o (4096->2560) through: the base projections
alone, each kernel (`merged` with one shared route, as it requires), and the per-row,
per-expert loop of `mixture.reference_delta`, run op by op (`loop_s`) and jitted (`loop_jit_s`). One adapter through peft's LoRA layers in PyTorch is timed beside the base
torch projections. Each shape reports best_ratio_vs_base (best kernel / base) and
speedup_vs_loop (op-by-op loop / best per-row kernel).
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from benchmarks.common import write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_QUICK = flags.DEFINE_bool("quick", False, "Two token counts, fewer repeats (< 1 minute).")

HIDDEN, Q, KV = 2560, 4096, 1024
PROJ = {"q": (HIDDEN, Q), "v": (HIDDEN, KV), "o": (Q, HIDDEN)}
ROWS, RANK, ALPHA, EXPERTS = 8, 8, 16.0, 6
ROUTES = [[0, 2, 3], [1, 4, 5], [0, 3, 4], [1, 2, 5], [0, 2, 5], [1, 3, 4], [0, 4, 5], [1, 2, 3]]


def _median_time(fn, args, repeats):
  import jax

  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run_shape(tokens: int, repeats: int):
  import jax
  import jax.numpy as jnp

  from morse_jax.lora import mixture

  seq = tokens // ROWS
  keys = iter(jax.random.split(jax.random.key(0), 16))
  x = jax.random.normal(next(keys), (ROWS, seq, HIDDEN))
  x_o = jax.random.normal(next(keys), (ROWS, seq, Q))
  weights = {n: 0.02 * jax.random.normal(next(keys), (o, d)) for n, (d, o) in PROJ.items()}
  experts = {n: (0.02 * jax.random.normal(next(keys), (EXPERTS, d, RANK)),
                 0.02 * jax.random.normal(next(keys), (EXPERTS, RANK, o)))
             for n, (d, o) in PROJ.items()}
  scale = ALPHA / RANK
  mixed = mixture.uniform_routes(ROUTES)
  shared = mixture.uniform_routes([ROUTES[0]] * ROWS)

  @jax.jit
  def base(x, x_o, weights):
    return [jnp.einsum("btd,od->bto", x_o if n == "o" else x, weights[n]) for n in PROJ]

  def kernel_fn(kernel):
    @jax.jit
    def run(x, x_o, weights, experts, routes):
      return [mixture.adapted_linear(x_o if n == "o" else x, weights[n], None, *experts[n],
                                     routes, scale, kernel) for n in PROJ]
    return run

  @jax.jit
  def loop(x, x_o, weights, experts):  # routes are concrete: the loop unrolls rows x experts
    return [jnp.einsum("btd,od->bto", x_o if n == "o" else x, weights[n])
            + mixture.reference_delta(x_o if n == "o" else x, *experts[n], mixed, scale)
            for n in PROJ]

  result = {"tokens": tokens, "rows": ROWS}
  result["base_s"] = _median_time(base, (x, x_o, weights), repeats)
  kernel_times = {}
  for kernel in ("dense", "gather", "grouped", "merged"):
    routes = shared if kernel == "merged" else mixed
    kernel_times[kernel] = _median_time(kernel_fn(kernel), (x, x_o, weights, experts, routes),
                                        repeats)
  result["kernel_s"] = kernel_times
  result["loop_jit_s"] = _median_time(loop, (x, x_o, weights, experts), max(1, repeats // 2))
  with jax.disable_jit():  # the plain Python loop, op by op, as a naive multi-LoRA would run
    result["loop_s"] = _median_time(loop, (x, x_o, weights, experts), max(1, repeats // 2))
  # Per-row routes are what MoRSE rollouts need; `merged` serves only a batch-wide route.
  per_row = {k: v for k, v in kernel_times.items() if k != "merged"}
  best = min(per_row, key=per_row.get)
  result["best_kernel"] = best
  result["best_ratio_vs_base"] = per_row[best] / result["base_s"]
  result["speedup_vs_loop"] = result["loop_s"] / per_row[best]
  result["speedup_vs_jitted_loop"] = result["loop_jit_s"] / per_row[best]
  result["merged_ratio_vs_base"] = kernel_times["merged"] / result["base_s"]
  result.update(_peft_times(tokens, repeats))
  return result


def _peft_times(tokens: int, repeats: int):
  """One adapter with peft's LoRA layers in PyTorch, against the same torch projections."""
  import torch
  from peft import LoraConfig, get_peft_model

  class Proj(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.q_proj = torch.nn.Linear(HIDDEN, Q, bias=False)
      self.v_proj = torch.nn.Linear(HIDDEN, KV, bias=False)
      self.o_proj = torch.nn.Linear(Q, HIDDEN, bias=False)

    def forward(self, x, x_o):
      return self.q_proj(x), self.v_proj(x), self.o_proj(x_o)

  torch.manual_seed(0)
  x = torch.randn(ROWS, tokens // ROWS, HIDDEN)
  x_o = torch.randn(ROWS, tokens // ROWS, Q)
  base = Proj().eval()
  peft_model = get_peft_model(Proj().eval(), LoraConfig(
      r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj", "o_proj"],
      lora_dropout=0.0)).eval()

  def timed(module):
    with torch.no_grad():
      module(x, x_o)
      times = []
      for _ in range(repeats):
        start = time.perf_counter()
        module(x, x_o)
        times.append(time.perf_counter() - start)
    return statistics.median(times)

  torch_base, torch_peft = timed(base), timed(peft_model)
  return {"torch_base_s": torch_base, "peft_one_adapter_s": torch_peft,
          "peft_ratio_vs_torch_base": torch_peft / torch_base}


def main(argv):
  del argv
  sizes = [256, 1024] if _QUICK.value else [256, 1024, 4096]
  repeats = 2 if _QUICK.value else 7
  results = []
  print(f"{'tokens':>6} {'base ms':>8} " + " ".join(f"{k:>8}" for k in
                                                  ("dense", "gather", "grouped", "merged"))
        + f" {'loop ms':>8} {'jit loop':>8} {'best/base':>9} {'loop/best':>9} {'peft/torch':>10}")
  for tokens in sizes:
    r = run_shape(tokens, repeats)
    results.append(r)
    ks = " ".join(f"{1e3 * r['kernel_s'][k]:8.2f}" for k in ("dense", "gather", "grouped",
                                                            "merged"))
    print(f"{tokens:>6} {1e3 * r['base_s']:8.2f} {ks} {1e3 * r['loop_s']:8.2f} "
          f"{1e3 * r['loop_jit_s']:8.2f} "
          f"{r['best_ratio_vs_base']:8.3f}x {r['speedup_vs_loop']:8.1f}x "
          f"{r['peft_ratio_vs_torch_base']:9.3f}x   (best: {r['best_kernel']})", flush=True)
  write_report("mixture", _OUT.value, shapes=results)


if __name__ == "__main__":
  app.run(main)
