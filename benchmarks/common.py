"""What every benchmark shares: the machine description and JSON report, a median timer, and the
single-agent HumanEval prompts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time


def median_seconds(fn, repeats: int) -> float:
  """The median wall time of `repeats` calls of fn()."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def threads_seconds(threads) -> float:
  """Starts `threads` at once and joins them: the wall seconds from the first start."""
  start = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return time.perf_counter() - start


def write_report(name: str, out: str | None, **fields) -> dict:
  """Adds machine and library versions to `fields`, writes JSON to `out` when given."""
  import jax
  import torch

  report = {"benchmark": name, "machine": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "jax": jax.__version__, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "backend": jax.default_backend(), **fields}
  if out:
    with open(out, "w") as f:
      json.dump(report, f, indent=2)
    print(f"wrote {out}")
  return report


def single_agent_prompts(model, family, problems) -> list[list[int]]:
  """What `runner.run` sends for the single system: one executor call per problem."""
  from morse_jax.mas import graph as graph_lib
  from morse_jax.mas import prompts

  out = []
  for p in problems:
    node = graph_lib.single_node(p.statement).nodes[0]
    messages = prompts.executor(p.statement, node, "",
                                family.executor_instructions(p, node.to_dict()))
    prefix = model.tokenizer.encode(family.reply_prefix(p, node.to_dict()))
    out.append(model.tokenizer.apply_chat_template(messages, add_generation_prompt=True) + prefix)
  return out
