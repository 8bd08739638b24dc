"""The demo's update on the committed toy backbone, in three row layouts measured in the same run:

  prompt+max_new   T = bucket(longest prompt) + bucket(max_new_tokens), every row (before 2026-11-30)
  longest_row      T = length_bucket(longest real row), every row
  signal_rows      longest_row, and the rows of nodes with flat rewards left out (compaction)
  shared_prompts   signal_rows, and each route's prompt run once for its M candidates
                   (compaction.share_prefixes; what the trainer does since 2026-11-30)

  python -m benchmarks.demo_update [--out FILE] [--repeats N]

The batch has the demo's shape: 4 nodes x B 2 routes x M 4 candidates, prompts of 520-650
tokens (the executor prompts of configs/morse/demo_cpu.py measure 360-700), completions of
20-120 tokens against a 160-token cap, and two of the four nodes flat (the demo runs about half).
Each layout runs one jitted `train_step` (MoLE + HGRPO, LoRA on the last 2 layers, f32); the
expert loss and gradient norm must agree across layouts, since they are the same update.
Compile time is excluded.
"""

from __future__ import annotations

import os
import statistics
import time

from absl import app, flags

from benchmarks.common import write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per layout (median reported).")
_LAYOUTS = flags.DEFINE_list("layouts", [], "Only these layouts (default: all; the first given "
                             "is the speedups' base).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES, B, M, MAX_NEW = 4, 2, 4, 160
PROMPTS = (520, 560, 610, 650)
FLAT = (2, 3)


def batches():
  """{layout: (PolicyBatch, RouterBatch)} and the model pieces."""
  import jax
  import numpy as np

  from morse_jax import llm, lora
  from morse_jax.lora import mixture, router
  from morse_jax.rl import compaction
  from morse_jax.rl import rollout as R
  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  model = llm.load(os.path.join(ROOT, "assets", "toy_qwen3"))
  config = model.config
  lcfg = lora.LoraConfig(last_n_layers=2, rank=8, alpha=16.0, num_subtask_experts=4)
  rcfg = router.RouterConfig(dim=32, top_k=2)
  experts = jax.tree.map(lambda x: x + 1e-3, lora.init_experts(lcfg, config, jax.random.key(1)))
  rparams = router.init_router(rcfg, config.hidden_size, 4, jax.random.key(2))
  rng = np.random.default_rng(0)
  rows, rewards = [], []
  for n, p in enumerate(PROMPTS):
    prompt = rng.integers(3, config.vocab_size, p).tolist()
    for _ in range(B * M):
      c = int(rng.integers(20, 121))
      rows.append([R.Segment(prompt), R.Segment(rng.integers(3, config.vocab_size, c).tolist(),
                                                (-rng.random(c) * 3).tolist())])
      rewards.append(0.5 if n in FLAT else float(rng.integers(0, 2)))
    if n not in FLAT:  # at least one right and one wrong candidate: the node is not flat
      rewards[-B * M:-B * M + 2] = [1.0, 0.0]
  per_route = [[0] + [2 + int(j) for j in rng.choice(4, 2, replace=False)]
               for _ in range(NODES * B)]
  sets = [s for s in per_route for _ in range(M)]  # a route's M candidates share experts
  rb = ts.RouterBatch(embeddings=rng.normal(size=(NODES * B, config.hidden_size)).astype(np.float32),
                      subtask_routes=np.asarray([rng.choice(4, 2, replace=False)
                                                 for _ in range(NODES * B)]),
                      mask=np.ones(NODES * B, np.float32))

  def policy(length):
    p = R.pack(rows, length=length)
    return ts.PolicyBatch(tokens=p.tokens, attention_mask=p.attention_mask, loss_mask=p.loss_mask,
                          logp_old=p.logp_old, rewards=np.asarray(rewards, np.float32),
                          route=(np.arange(len(rows)) // M).astype(np.int32),
                          valid=np.ones(len(rows), np.float32),
                          routes=mixture.uniform_routes(sets, 3))

  old = policy(llm.bucket(max(PROMPTS)) + llm.bucket(MAX_NEW))
  new = policy(None)
  small, dropped = compaction.without_flat_nodes(new, routes_per_node=B, aggregation="token-mean")
  assert dropped == len(FLAT), dropped
  layouts = {"prompt+max_new": old, "longest_row": new, "signal_rows": small,
             "shared_prompts": compaction.share_prefixes(small)}
  return model, lcfg, rcfg, experts, rparams, {k: (v, rb) for k, v in layouts.items()}


def main(argv):
  del argv
  import jax

  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  model, lcfg, rcfg, experts, rparams, layouts = batches()
  step_config = ts.StepConfig(expert_lr=2e-3, router_lr=1e-3)
  states = ts.init_opt_states(experts, rparams, step_config)
  # Nothing donated: the timed calls reuse the same inputs.
  update = update_lib.Update(model.config, lcfg, step_config, rcfg, kernel="dense",
                             routes_per_node=B, donate=())
  kwargs = dict(update=update, num_routes=NODES * B)
  results, metrics = [], {}
  unknown = sorted(set(_LAYOUTS.value) - set(layouts))
  if unknown:
    raise app.UsageError(f"--layouts: {unknown} not in {list(layouts)}")
  for name in _LAYOUTS.value or layouts:
    batch, rb = layouts[name]
    fn = update.step_fn.lower(model.params, experts, rparams, states, batch, rb, **kwargs).compile()
    run = lambda: jax.block_until_ready(fn(model.params, experts, rparams, states, batch, rb))
    metrics[name] = jax.device_get(run()[3])
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      run()
      times.append(time.perf_counter() - start)
    rows, length = (batch.tokens if batch.shared is None else batch.shared.tokens).shape
    results.append({"layout": name, "rows": rows, "tokens_per_row": length,
                    "step_s": statistics.median(times),
                    "expert_loss": float(metrics[name]["expert_loss"]),
                    "expert_grad_norm": float(metrics[name]["expert_grad_norm"])})
  base = results[0]["step_s"]
  for r in results:
    r["speedup"] = base / r["step_s"]
    print(f"{r['layout']:<16} {r['rows']:3d} rows x {r['tokens_per_row']:5d}  "
          f"{r['step_s']:6.2f} s  x{r['speedup']:.2f}  loss {r['expert_loss']:.6f}  "
          f"grad norm {r['expert_grad_norm']:.6f}", flush=True)
  for r in results[1:]:  # the same update in every layout
    for key in ("expert_loss", "expert_grad_norm"):
      ref = results[0][key]
      if abs(r[key] - ref) > 1e-4 * max(abs(ref), 1e-6):
        raise AssertionError(f"{r['layout']}: {key} {r[key]} differs from {ref}")
  write_report("demo_update", _OUT.value, device=jax.devices()[0].device_kind, results=results)


if __name__ == "__main__":
  app.run(main)
