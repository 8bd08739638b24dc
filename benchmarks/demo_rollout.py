"""The MoRSE demo's training rollout on the static sampler and on the generation engine, in turn
in one process (issue 55):

  python -m benchmarks.demo_rollout [--out FILE] [--repeats N] [--tasks N]

Rows: the demo's (configs/morse/demo_cpu.py) first wave for `--tasks` training problems, each
node B 2 routes x M 4 candidates at T 1.0 with up to 160 new tokens, prompts built as the
trainer builds them, the toy backbone with experts of small random weights. Each repeat draws
another key; both samplers get the same keys, so the rows must be the same (checked: tokens
equal, log-probs within 1e-5). Compile time is excluded (one untimed call each first) and
reported apart, with the number of programs each compiled.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from benchmarks.common import write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rollouts per sampler (median reported).")
_TASKS = flags.DEFINE_integer("tasks", 4, "Training problems whose first wave is rolled out.")


def requests():
  """(the demo's trainer, agents, its first wave's requests, experts)."""
  import jax
  import numpy as np

  from configs.morse import demo_cpu
  from morse_jax.experiments import experiment
  from morse_jax.mas import runner
  from morse_jax.rl import rollout as rollout_lib

  config = demo_cpu.get_config()
  exp = experiment.build(config)
  problems = experiment.split(config, exp.problems, "train")[:_TASKS.value]
  tasks = [runner.TaskOutcome(p, g) for p, g in zip(problems, exp.graphs(problems))]
  trainer = exp.trainer()
  state = trainer.init_state(jax.random.key(0))
  experts = jax.tree.map(lambda x: x + 1e-3 * jax.random.normal(jax.random.key(1), x.shape),
                         state.experts)
  rng = np.random.default_rng(0)
  out = []
  for t, node in runner.wave_items(tasks, 0):
    prompt = runner.executor_prompt(exp.agents, exp.family, tasks[t], node, "")
    routes = [sorted(rng.choice(4, 2, replace=False).tolist()) for _ in range(2)]
    out.append(rollout_lib.NodeRequest(prompt, "execute", routes, routed=False))
  return trainer, out, experts


def main(argv):
  del argv
  import jax
  import numpy as np

  from morse_jax.rl import rollout as rollout_lib
  from morse_jax.rl.engine_sampler import EngineSampler

  trainer, nodes, experts = requests()
  samplers = {"static": None, "engine": EngineSampler(trainer.model)}
  results, rollouts = [], {}
  for name, sampler in samplers.items():
    call = lambda k: rollout_lib.rollout(
        trainer.model, experts, trainer.lora, nodes, trainer.generation, group_size=4,
        rng=jax.random.key(k), rows_multiple=trainer.rows_multiple,
        kernel=trainer.rollout_config.kernel, sampler=sampler)
    start = time.perf_counter()
    call(100)  # compiles
    first = time.perf_counter() - start
    times, rollouts[name] = [], []
    for k in range(_REPEATS.value):
      start = time.perf_counter()
      rollouts[name].append(call(k))
      times.append(time.perf_counter() - start)
    tokens = [r.generated_tokens() for r in rollouts[name]]
    results.append({"sampler": name, "rows": rollouts[name][0].num_rows,
                    "first_call_s": first, "rollout_s": statistics.median(times),
                    "times_s": times, "generated_tokens": tokens})
    print(f"{name:<7} {results[-1]['rows']} rows  first call {first:6.1f} s  rollout "
          f"{results[-1]['rollout_s']:6.2f} s (median of {times})  tokens {tokens}", flush=True)
  for a, b in zip(rollouts["static"], rollouts["engine"]):
    equal = [x.tolist() for x in a.completions] == [x.tolist() for x in b.completions]
    gap = float(np.abs(a.packed.logp_old - b.packed.logp_old).max()) if equal else None
    results.append({"tokens_equal": equal, "max_logp_gap": gap})
    print(f"tokens equal: {equal}, max log-prob gap: {gap}")
  results.append({"ratio_static_over_engine": results[0]["rollout_s"] / results[1]["rollout_s"]})
  print(results[-1])
  write_report("demo_rollout", _OUT.value, device=jax.devices()[0].device_kind, results=results)


if __name__ == "__main__":
  app.run(main)
