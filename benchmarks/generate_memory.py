"""Peak resident memory of one generate call against weights + cache, and the resident set over
time (/proc/self/status VmRSS, written as it goes, so a killed run leaves its series).

  python -m benchmarks.generate_memory [--model=DIR] [--dtype=bfloat16] [--rows=32]
      [--gen_len=512] [--max_new=32] --out=FILE.json

Single-agent HumanEval prompts (the first `--rows`), the cache sized for `--gen_len` new tokens,
`--max_new` of them generated (EOS off), as `llm.sample` runs it (the default decode layout, the
uint16 weight view on CPU). The peak (VmHWM) is reset after loading, so it is the generate
call's own; the load's peak is reported beside it. Qwen2.5-Coder-1.5B: under
`flock /work/runs/qwen.lock` on a shared machine.
"""

from __future__ import annotations

import json
import os
import threading
import time

from absl import app, flags

_MODEL = flags.DEFINE_string("model", "~/.cache/morse_jax/models/Qwen2.5-Coder-1.5B-Instruct",
                             "Hugging Face folder.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "Weights.")
_ROWS = flags.DEFINE_integer("rows", 32, "Rows (HumanEval prompts).")
_GEN_LEN = flags.DEFINE_integer("gen_len", 512, "New-token capacity of the cache.")
_MAX_NEW = flags.DEFINE_integer("max_new", 32, "Tokens generated.")
_OUT = flags.DEFINE_string("out", None, "JSON result; FILE.series gets the RSS over time.")


def status() -> dict:
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmHWM", "VmRSS"):
        out[key] = int(value.split()[0]) * 1024
  return out


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  from benchmarks import decode_step
  from benchmarks.common import single_agent_prompts
  from morse_jax import llm
  from morse_jax.llm import model as model_lib
  from morse_jax.llm import sampling as sampling_lib
  from morse_jax.tasks import humaneval

  t0 = time.time()
  model = llm.load(os.path.expanduser(_MODEL.value), dtype=getattr(jnp, _DTYPE.value))
  load = status()
  rows = _ROWS.value
  prompts = single_agent_prompts(model, humaneval.HumanEval(), humaneval.load()[:rows])
  p = sampling_lib.length_bucket(max(len(x) for x in prompts))
  weights = decode_step.weight_bytes(model.params)
  cache = decode_step.cache_bytes(model.config, rows, p + _GEN_LEN.value,
                                  model.params.embed.dtype.itemsize)
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM from here on: the generate call's own peak
  series_file = open((_OUT.value or "/dev/null") + ".series", "w")
  series_file.write(json.dumps({"weights": weights, "cache": cache, "prompt_bucket": p,
                                "load": load}) + "\n")
  stop = threading.Event()

  def watch():
    while not stop.is_set():
      s = status()
      series_file.write(f"{time.time() - t0:.1f} {s['VmRSS']} {s['VmHWM']}\n")
      series_file.flush()
      time.sleep(0.5)

  threading.Thread(target=watch, daemon=True).start()
  tokens, mask = sampling_lib.left_pad(prompts, p, rows, model.tokenizer.pad_id)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(rows))
  unstack = sampling_lib.default_unstack(model.params)
  start = time.time()
  out = sampling_lib.generate_padded(
      model.params, model.config, jnp.asarray(tokens), jnp.asarray(mask), keys,
      jnp.int32(_MAX_NEW.value),
      llm.GenerationSettings(_GEN_LEN.value, llm.GREEDY, unstack=unstack),
      bits=model_lib.bits_view(model.params))
  jax.block_until_ready(out)
  seconds = time.time() - start
  stop.set()
  peak = status()["VmHWM"]
  result = {"model": _MODEL.value, "dtype": _DTYPE.value, "rows": rows, "prompt_bucket": p,
            "gen_len": _GEN_LEN.value, "max_new": _MAX_NEW.value, "fused_decode_layout": unstack,
            "weight_bytes": weights, "cache_bytes": cache, "load_peak_bytes": load["VmHWM"],
            "generate_peak_bytes": peak, "generate_s": seconds,
            "peak_over_weights_and_cache": peak / (weights + cache)}
  print(json.dumps(result))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
