"""Milliseconds per decode step of our sampler on a real model, per-layer KV cache or stacked.

  python -m benchmarks.decode_step [--model=DIR] [--rows=32] [--prompt=300] [--cache=per_layer]

Times greedy generation of 32 and 96 tokens (EOS off) after a warm-up call and reports the
difference per extra token, so prefill and compiles drop out. `--cache=stacked` runs the decode
loop as it was before the per-layer cache (one stacked [l, b, k, s, x] array sliced per layer);
run both in separate processes (the choice is fixed when the loop is compiled).
"""

from __future__ import annotations

import os
import time

from absl import app, flags

_MODEL = flags.DEFINE_string("model", "~/.cache/morse_jax/models/SmolLM2-135M-Instruct",
                             "Hugging Face folder or .gguf file.")
_ROWS = flags.DEFINE_integer("rows", 32, "Rows per call.")
_PROMPT = flags.DEFINE_integer("prompt", 300, "Prompt tokens per row.")
_CACHE = flags.DEFINE_enum("cache", "per_layer", ["per_layer", "stacked"], "Decode-loop cache.")


def main(argv):
  del argv
  import jax
  import numpy as np

  from morse_jax import llm
  from morse_jax.llm import sampling

  if _CACHE.value == "stacked":
    sampling.unstack_cache = lambda cache: cache
  model = llm.load(os.path.expanduser(_MODEL.value))
  prompts = np.random.RandomState(0).randint(5, model.config.vocab_size,
                                             (_ROWS.value, _PROMPT.value)).tolist()
  seconds = {}
  for new in (32, 96):
    def call():
      return llm.sample(model.params, model.config, prompts, max_new_tokens=new,
                        rng=jax.random.key(0), sampling=llm.GREEDY, eos_ids=())
    call()
    start = time.perf_counter()
    out = call()
    seconds[new] = time.perf_counter() - start
  step_ms = 1000 * (seconds[96] - seconds[32]) / 64
  print(f"{_CACHE.value}: {step_ms:.0f} ms per decode step ({_ROWS.value} rows, "
        f"{_PROMPT.value}-token prompts); first tokens {out.tokens[0, :8].tolist()}")


if __name__ == "__main__":
  app.run(main)
