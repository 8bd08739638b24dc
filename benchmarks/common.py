"""What every benchmark shares: the machine description and JSON report, a median timer, the
single-agent HumanEval prompts and the models a benchmark names (`bench_model`)."""

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


def greedy_chat(url: str, messages: list[dict], max_tokens: int) -> dict:
  """One greedy POST /v1/chat/completions to a server at `url` (http://host:port); its reply
  JSON (a status other than 200 raises)."""
  import http.client

  host, port = url.split("//")[1].split(":")
  conn = http.client.HTTPConnection(host, int(port), timeout=3600)
  body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
  conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
               headers={"Content-Type": "application/json"})
  resp = conn.getresponse()
  out = json.loads(resp.read())
  conn.close()
  if resp.status != 200:
    raise RuntimeError(f"status {resp.status}: {out}")
  return out


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


REAL_MODEL = "~/.cache/morse_jax/models/SmolLM2-135M-Instruct"
TOY = os.path.join(os.path.dirname(__file__), "..", "assets", "toy_qwen3")


def model_folder(name: str) -> str | None:
  """The folder a benchmark's --model names; None for a random model (`bench_model`)."""
  from morse_jax.llm.presets import ARCHITECTURES

  if name == "tiny" or name in ARCHITECTURES:
    return None
  return os.path.expanduser(REAL_MODEL if name == "smollm2" else name)


def bench_model(name: str, dtype_name: str = "float32"):
  """The model a benchmark's --model names: `tiny` (a random 2-layer model), a name in
  `llm.presets.ARCHITECTURES` (random weights at those shapes), both with `assets/toy_qwen3`'s
  tokenizer and chat template; `smollm2` (the local SmolLM2-135M-Instruct) or a model folder."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  from morse_jax import llm
  from morse_jax.llm.presets import ARCHITECTURES

  dtype = getattr(jnp, dtype_name)
  if model_folder(name):
    return llm.load(model_folder(name), dtype=dtype)
  toy = llm.load(TOY, dtype=dtype)
  if name == "tiny":
    config = dataclasses.replace(toy.config, hidden_size=64, intermediate_size=128,
                                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    params = llm.init_random(config, jax.random.key(0), dtype=dtype, scale=0.3)
  else:
    config = ARCHITECTURES[name]
    params = llm.init_random(config, jax.random.key(0), dtype=dtype)
  return dataclasses.replace(toy, config=config, params=params)
