"""What `config.cpu_threads` costs: the demos' update and sampler at several XLA:CPU pool sizes,
each in a process of its own (XLA sizes the pool when JAX's CPU backend starts).

  python -m benchmarks.cpu_threads [--threads=0,1,2] [--repeats 3] [--out FILE]

0 is XLA's default, a thread per schedulable core (morse_jax.runtime.use_cpu_threads).
update: `benchmarks.demo_update`'s "shared_prompts" batch, what the MoRSE demo's trainer runs
(4 nodes x 2 routes x 4 candidates, MoLE + HGRPO, the committed toy_qwen3). sample: the APEx
demo's executor call on the committed toy_apex, its role expert, 16 prompts of 600 tokens, 80
tokens drawn at temperature 1. Compile time is excluded; medians of `--repeats` calls. Each row
also gives a digest of what the call returned: equal digests, equal bits.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from absl import app, flags

from benchmarks import demo_update  # its --out and --repeats are this benchmark's too
from benchmarks.common import median_seconds, write_report

_THREADS = flags.DEFINE_list("threads", ["0", "1", "2"], "Pool sizes (0: XLA's default).")
_CHILD = flags.DEFINE_bool("child", False, "Measure in this process and print one JSON line.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, PROMPT, NEW = 16, 600, 80


def digest(tree) -> str:
  import jax
  import numpy as np

  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(tree)):
    h.update(np.asarray(leaf).tobytes())
  return h.hexdigest()[:16]


def update_case() -> tuple[float, str]:
  import jax

  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  model, lcfg, rcfg, experts, rparams, layouts = demo_update.batches()
  batch, rb = layouts["shared_prompts"]
  step = ts.StepConfig(expert_lr=2e-3, router_lr=1e-3)
  states = ts.init_opt_states(experts, rparams, step)
  update = update_lib.Update(model.config, lcfg, step, rcfg, kernel="dense",
                             routes_per_node=demo_update.B, donate=())
  fn = update.step_fn.lower(model.params, experts, rparams, states, batch, rb, update=update,
                            num_routes=demo_update.NODES * demo_update.B).compile()
  run = lambda: jax.block_until_ready(fn(model.params, experts, rparams, states, batch, rb))
  out = run()
  return median_seconds(run, flags.FLAGS.repeats), digest(out)


def sample_case() -> tuple[float, str]:
  import jax
  import numpy as np

  from apex_jax.agents.generator import AdapterGenerator
  from apex_jax.experiment import lora_config
  from configs.apex import demo_cpu
  from morse_jax import llm
  from morse_jax.lora import experts as lora_lib

  c = demo_cpu.get_config()
  model = llm.load(c.model.path, dtype=c.model.dtype)
  lora = lora_config(c)
  experts = jax.tree.map(lambda x: x + 1e-3,  # B != 0: the expert changes the logits
                         lora_lib.init_experts(lora, model.config, jax.random.PRNGKey(0)))
  generator = AdapterGenerator(model, experts, lora)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, model.config.vocab_size, PROMPT).tolist() for _ in range(ROWS)]
  sampling = llm.SamplingConfig(temperature=1.0)
  run = lambda: generator.generate("executor", prompts, rng=jax.random.PRNGKey(1),
                                   max_new_tokens=NEW, sampling=sampling)
  out = run()  # compiles
  return median_seconds(run, flags.FLAGS.repeats), digest([g.tokens for g in out] +
                                                     [g.logprobs for g in out])


def child() -> None:
  from morse_jax import runtime

  result = {"threads": runtime.cpu_threads()}
  for name, case in (("update", update_case), ("sample", sample_case)):
    result[f"{name}_s"], result[f"{name}_digest"] = case()
  print(json.dumps(result), flush=True)


def main(argv):
  del argv
  if _CHILD.value:
    child()
    return
  results = []
  for n in (int(t) for t in _THREADS.value):
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC", "XLA_FLAGS")}
    if n:
      env["PJRT_NPROC"] = str(n)
    done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_threads", "--child",
                           f"--repeats={flags.FLAGS.repeats}"], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True)
    row = {"cpu_threads": n, **json.loads(done.stdout.strip().splitlines()[-1])}
    results.append(row)
    print(f"cpu_threads {n} ({row['threads']} threads): update {row['update_s']:.3f} s "
          f"[{row['update_digest']}], sample {row['sample_s']:.3f} s [{row['sample_digest']}]",
          flush=True)
  write_report("cpu_threads", flags.FLAGS.out, cores=len(os.sched_getaffinity(0)),
               results=results)


if __name__ == "__main__":
  app.run(main)
