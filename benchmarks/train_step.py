"""The jitted update: HGRPO against GRPO in the same run, tokens per second, and achieved FLOP/s
as a fraction of this machine's matmul peak, measured in the same run.

  python -m benchmarks.train_step [--out FILE] [--quick] [--repeats N]

Both estimators run the same step function on the same batch (random rewards, so no update is
skipped); only the advantage code differs, so the ratio is the cost of the hierarchy. FLOPs are
counted analytically (`model_flops`: the forward matmuls and attention, times 2 for the backward
pass to the activations; the frozen backbone gets no weight gradient; LoRA FLOPs left out) and by
the compiler (`cost_analysis`, which counts a `lax.scan` body once, so it undercounts the
layer stack); the fraction of peak uses the analytic count. The peak is the best of several
square f32 matmuls (1024 and 2048). Compile time is excluded and reported separately.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app, flags

from benchmarks.common import write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_QUICK = flags.DEFINE_bool("quick", False, "Small model, one repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed steps per estimator (median reported).")
_LARGE = flags.DEFINE_bool("large", False, "Add a ~1.2B-parameter case (for accelerators).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Backbone weights (experts and router stay f32); also the peak's.")

MODELS = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16),
    # ~32M parameters (24M outside the embeddings), Llama-shaped; LoRA on q, v, o of the last
    # 4 layers (the authors' targets).
    "llama_32m": dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=8,
                      num_heads=8, num_kv_heads=4, head_dim=64),
    # ~1.2B parameters, Llama-shaped (--large).
    "llama_1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=16,
                     num_heads=16, num_kv_heads=8, head_dim=128),
}
NODES, B, M, PROMPT, NEW = 2, 4, 4, 64, 64  # 32 rows x 128 tokens


def matmul_peak_flops(sizes=(1024, 2048), repeats: int = 10, dtype="float32") -> float:
  """The best square-matmul rate (inputs in `dtype`, XLA's default precision) over a few sizes."""
  import jax
  import jax.numpy as jnp

  best = 0.0
  for n in sizes:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    seconds = min(_seconds(lambda: f(a, a).block_until_ready()) for _ in range(repeats))
    best = max(best, 2 * n ** 3 / seconds)
  return best


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def model_flops(config, rows: int, length: int) -> float:
  """2 x forward FLOPs of one step over rows x length tokens (full-square attention, as computed)."""
  c = config
  per_token = c.num_layers * (2 * c.hidden_size * c.q_size + 2 * c.hidden_size * c.kv_size
                              + 3 * c.hidden_size * c.intermediate_size)
  per_token += c.hidden_size * c.vocab_size  # the head
  forward = 2 * rows * length * per_token + c.num_layers * 4 * rows * length ** 2 * c.q_size
  return 2.0 * forward


def make_case(shape, dtype="float32"):
  import jax
  import numpy as np

  from morse_jax import llm, lora
  from morse_jax.lora import mixture, router
  from morse_jax.rl import train_step as ts

  config = llm.LlmConfig("llama", **shape)
  lcfg = lora.LoraConfig(last_n_layers=min(4, config.num_layers), rank=8, alpha=16.0,
                         num_subtask_experts=4)
  rcfg = router.RouterConfig(dim=32, top_k=2)
  backbone = llm.init_random(config, jax.random.key(0), dtype=getattr(jax.numpy, dtype),
                             scale=0.02)
  experts = jax.tree.map(lambda x: x + 1e-3, lora.init_experts(lcfg, config, jax.random.key(1)))
  rparams = router.init_router(rcfg, config.hidden_size, 4, jax.random.key(2))
  rows, length = NODES * B * M, PROMPT + NEW
  rng = np.random.default_rng(0)
  loss_mask = np.zeros((rows, length), np.float32)
  loss_mask[:, PROMPT:] = 1
  sets = [[0] + [2 + int(j) for j in rng.choice(4, 2, replace=False)] for _ in range(rows)]
  batch = ts.PolicyBatch(
      tokens=rng.integers(1, config.vocab_size, (rows, length)).astype(np.int32),
      attention_mask=np.ones((rows, length), np.int32), loss_mask=loss_mask,
      logp_old=(-8.0 * loss_mask).astype(np.float32),
      rewards=rng.random(rows).astype(np.float32),
      route=(np.arange(rows) // M).astype(np.int32), valid=np.ones(rows, np.float32),
      routes=mixture.uniform_routes(sets, 3))
  rbatch = ts.RouterBatch(
      embeddings=rng.normal(size=(NODES * B, config.hidden_size)).astype(np.float32),
      subtask_routes=np.asarray([rng.choice(4, 2, replace=False) for _ in range(NODES * B)]),
      mask=np.ones(NODES * B, np.float32))
  return config, lcfg, rcfg, backbone, experts, rparams, batch, rbatch


def run_case(name, shape, repeats, dtype="float32"):
  import jax

  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  config, lcfg, rcfg, backbone, experts, rparams, batch, rbatch = make_case(shape, dtype)
  steps, compiled = {}, {}
  for estimator in ("hgrpo", "grpo"):
    step_config = ts.StepConfig(estimator=estimator)
    states = ts.init_opt_states(experts, rparams, step_config)
    # Nothing donated: the timed calls reuse the same inputs.
    update = update_lib.Update(config, lcfg, step_config, rcfg, routes_per_node=B, donate=())
    kwargs = dict(update=update, num_routes=NODES * B)
    args = (backbone, experts, rparams, states, batch, rbatch)
    start = time.perf_counter()
    compiled[estimator] = update.step_fn.lower(*args, **kwargs).compile()
    compile_s = time.perf_counter() - start
    fn = compiled[estimator]
    steps[estimator] = (lambda fn=fn, args=args: jax.block_until_ready(fn(*args)), compile_s)
  times = {e: [] for e in steps}
  for _ in range(repeats):  # interleaved, so drift in machine load hits both alike
    for e, (fn, _) in steps.items():
      times[e].append(_seconds(fn))
  cost = compiled["hgrpo"].cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla_flops = float(cost.get("flops", 0.0))
  flops = model_flops(config, *batch.tokens.shape)
  hgrpo_s, grpo_s = statistics.median(times["hgrpo"]), statistics.median(times["grpo"])
  tokens = int(batch.tokens.size)
  return {"case": name, "params": config.num_params(), "rows": batch.tokens.shape[0],
          "tokens_per_row": batch.tokens.shape[1], "hgrpo_step_s": hgrpo_s,
          "grpo_step_s": grpo_s, "hgrpo_over_grpo": hgrpo_s / grpo_s,
          "tokens_per_s": tokens / hgrpo_s, "model_flops": flops, "xla_counted_flops": xla_flops,
          "achieved_flops_per_s": flops / hgrpo_s,
          "compile_s": {e: c for e, (_, c) in steps.items()}}


def main(argv):
  del argv
  import jax

  models = ["tiny"] if _QUICK.value else [m for m in MODELS if m != "llama_1b" or _LARGE.value]
  repeats = 1 if _QUICK.value else _REPEATS.value
  sizes = (1024, 2048) if jax.default_backend() == "cpu" else (4096, 8192)
  peak = matmul_peak_flops(sizes, dtype=_DTYPE.value)
  print(f"{jax.devices()[0].device_kind}: matmul peak ({_DTYPE.value}, measured): "
        f"{peak / 1e9:.1f} GFLOP/s", flush=True)
  results = []
  for name in models:
    r = run_case(name, MODELS[name], repeats, _DTYPE.value)
    r["fraction_of_peak"] = r["achieved_flops_per_s"] / peak
    results.append(r)
    print(f"{name:<10} HGRPO {r['hgrpo_step_s'] * 1e3:8.1f} ms  GRPO {r['grpo_step_s'] * 1e3:8.1f} ms"
          f"  ratio {r['hgrpo_over_grpo']:.3f}  {r['tokens_per_s']:9.0f} tok/s  "
          f"{r['achieved_flops_per_s'] / 1e9:6.1f} GFLOP/s = {r['fraction_of_peak']:.0%} of peak",
          flush=True)
  write_report("train_step", _OUT.value, device=jax.devices()[0].device_kind, dtype=_DTYPE.value,
               matmul_peak_flops_per_s=peak, results=results)


if __name__ == "__main__":
  app.run(main)
