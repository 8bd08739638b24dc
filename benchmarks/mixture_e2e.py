"""Per-row mixtures of LoRA experts end to end, at SmolLM2-135M shapes with the authors' layout
(q, v, o of the last 8 layers, r 8, role + 2 of 4 subtask experts).

  python -m benchmarks.mixture_e2e [--model=DIR] [--out=FILE] [--repeats=3] [--cases=sampler,update]

- sampler: `llm.sample` on the real weights, 8 rows of 350-token HumanEval prompts, 128 new
  tokens, greedy, EOS off: bare (no adapter) against 8 rows with 8 distinct routes (the per-row
  kernel `auto` picks) and against one route shared by every row (`merged`).
- update: one jitted `train_step` (HGRPO, the router's update included) on 8 rows x 256 tokens
  with the same backbone: 4 routes of 2 candidates each against one route shared by every row
  (what a trainer without per-row mixtures runs), with the kernel training picks for both, and
  against a plain single LoRA (`single`: every row on expert 0 alone, route width 1, the
  `gather` kernel: x A B per adapted projection, what peft trains). The router's update is in
  every variant's step.

Goals: both per-row ratios <= 1.10. Timings are medians of interleaved repeats, so
drift in machine load hits every variant alike; compiles are excluded.
"""

from __future__ import annotations

import os
import statistics
import time

from absl import app, flags

from benchmarks.common import write_report

ROWS, PROMPT, NEW, UPDATE_TOKENS = 8, 350, 128, 256
ROUTES = [[0, 2, 3], [0, 4, 5], [0, 2, 4], [0, 3, 5], [0, 2, 5], [0, 3, 4], [1, 2, 3], [1, 4, 5]]
SHARED = [[0, 2, 3]] * ROWS
UPDATE_ROUTES = [r for r in ROUTES[:ROWS // 2] for _ in range(2)]  # groups of 2 rows per route


def _interleaved(fns: dict, repeats: int) -> dict:
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - start)
  return {k: statistics.median(v) for k, v in times.items()}


def sampler_case(model, experts, lcfg, repeats: int) -> dict:
  import jax

  from benchmarks.rollout_real import humaneval_prompts
  from morse_jax import llm, lora

  prompts = humaneval_prompts(model, ROWS, PROMPT)
  adapters = {"bare": None,
              "per_row": lora.make_adapter(experts, lcfg, model.config, ROUTES),
              "shared": lora.make_adapter(experts, lcfg, model.config, SHARED)}

  def call(adapter):
    out = llm.sample(model, prompts, llm.GenerationSettings(NEW, llm.GREEDY),
                     rng=jax.random.key(0), adapter=adapter)
    return out.tokens

  fns = {k: (lambda a=a: call(a)) for k, a in adapters.items()}
  for fn in fns.values():
    fn()  # compile
  seconds = _interleaved(fns, repeats)
  return {"rows": ROWS, "prompt_tokens": PROMPT, "new_tokens": NEW, "seconds": seconds,
          "kernels": {k: None if a is None else a.kernel for k, a in adapters.items()},
          "per_row_over_bare": seconds["per_row"] / seconds["bare"],
          "shared_over_bare": seconds["shared"] / seconds["bare"]}


def update_case(model, experts, lcfg, repeats: int) -> dict:
  import jax
  import numpy as np

  from morse_jax import lora
  from morse_jax.lora import mixture, router
  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  config = model.config
  rcfg = router.RouterConfig(dim=32, top_k=2)
  rparams = router.init_router(rcfg, config.hidden_size, lcfg.num_subtask_experts,
                               jax.random.key(2))
  rng = np.random.default_rng(0)
  loss_mask = np.zeros((ROWS, UPDATE_TOKENS), np.float32)
  loss_mask[:, UPDATE_TOKENS // 2:] = 1
  rbatch = ts.RouterBatch(
      embeddings=rng.normal(size=(ROWS // 2, config.hidden_size)).astype(np.float32),
      subtask_routes=np.asarray([rng.choice(4, 2, replace=False) for _ in range(ROWS // 2)]),
      mask=np.ones(ROWS // 2, np.float32))
  step_config = ts.StepConfig(estimator="hgrpo")
  states = ts.init_opt_states(experts, rparams, step_config)
  kernel = lora.make_adapter(experts, lcfg, config, UPDATE_ROUTES).kernel
  fns = {}
  for name, sets, width, kern in (("per_row", UPDATE_ROUTES, 3, kernel),
                                  ("shared", SHARED, 3, kernel),
                                  ("single", [[0]] * ROWS, 1, "gather")):
    batch = ts.PolicyBatch(
        tokens=rng.integers(1, config.vocab_size, (ROWS, UPDATE_TOKENS)).astype(np.int32),
        attention_mask=np.ones((ROWS, UPDATE_TOKENS), np.int32), loss_mask=loss_mask,
        logp_old=(-8.0 * loss_mask).astype(np.float32),
        rewards=rng.random(ROWS).astype(np.float32),
        route=(np.arange(ROWS) // 2).astype(np.int32), valid=np.ones(ROWS, np.float32),
        routes=mixture.uniform_routes(sets, width))
    args = (model.params, experts, rparams, states, batch, rbatch)
    # Nothing donated: the timed calls reuse the same inputs.
    update = update_lib.Update(config, lcfg, step_config, rcfg, kernel=kern, routes_per_node=2,
                               donate=())
    compiled = update.step_fn.lower(*args, update=update, num_routes=ROWS // 2).compile()
    fns[name] = lambda c=compiled, a=args: jax.block_until_ready(c(*a))
  for fn in fns.values():
    fn()
  seconds = _interleaved(fns, repeats)
  return {"rows": ROWS, "tokens_per_row": UPDATE_TOKENS, "kernel": kernel, "seconds": seconds,
          "per_row_over_shared": seconds["per_row"] / seconds["shared"],
          "per_row_over_single": seconds["per_row"] / seconds["single"]}


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  from morse_jax import llm, lora

  f = flags.FLAGS
  model = llm.load(os.path.expanduser(f.model))
  lcfg = lora.LoraConfig()  # the authors' layout
  experts = lora.init_experts(lcfg, model.config, jax.random.key(1))
  # B starts at 0; non-zero deltas, as after some training (the cost does not depend on it)
  experts = jax.tree.map(lambda x: x + jnp.asarray(1e-3, x.dtype), experts)
  sampler = update = None
  if "sampler" in f.cases:
    sampler = sampler_case(model, experts, lcfg, f.repeats)
    print(f"sampler: per-row routes {sampler['per_row_over_bare']:.3f}x bare, one shared route "
          f"{sampler['shared_over_bare']:.3f}x ({sampler['seconds']})", flush=True)
  if "update" in f.cases:
    update = update_case(model, experts, lcfg, f.repeats)
    print(f"update: per-row routes {update['per_row_over_shared']:.3f}x one shared route, "
          f"{update['per_row_over_single']:.3f}x a plain single LoRA ({update['seconds']}, "
          f"kernel {update['kernel']})", flush=True)
  write_report("mixture_e2e", f.out or None, sampler=sampler, update=update,
               lora={"targets": lcfg.targets, "last_n_layers": lcfg.last_n_layers,
                     "rank": lcfg.rank, "experts": lcfg.num_experts})


if __name__ == "__main__":
  flags.DEFINE_string("model", "~/.cache/morse_jax/models/SmolLM2-135M-Instruct",
                      "Hugging Face folder.")
  flags.DEFINE_string("out", "benchmarks/results/mixture_e2e_cpu.json", "JSON ('' for none).")
  flags.DEFINE_integer("repeats", 3, "Interleaved timed repeats (median).")
  flags.DEFINE_list("cases", ["sampler", "update"], "Which cases to run.")
  app.run(main)
