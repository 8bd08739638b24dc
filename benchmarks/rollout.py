"""Generated tokens per second: our sampler against transformers' `generate`, same weights, one run.

  python -m benchmarks.rollout [--out FILE] [--quick] [--dtype float32|bfloat16]

Each case builds a random model with transformers (seeded), saves it, loads it with
`morse_jax.llm.load`, and times 16 rows x 64-token prompts x 128 new tokens on both sides with EOS
disabled, so both produce exactly rows * new_tokens tokens. Our compile is excluded (it is paid once
per bucket); the first transformers call is excluded as warm-up too.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from absl import app, flags

from benchmarks.common import write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model only, fewer repeats.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per side (median reported).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights on both sides.")

ROWS, PROMPT, NEW = 16, 64, 128

MODELS = {
    # ~0.5M parameters: sampler overhead dominates.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~110M parameters, Llama-shaped (GQA, SwiGLU, untied head).
    "llama_100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4),
}
MODES = {"greedy": dict(temperature=0.0, top_p=1.0), "sample_top_p": dict(temperature=1.0, top_p=0.9)}


def _time(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run_case(name, shape, mode, repeats, dtype_name):
  import jax
  import numpy as np
  import torch
  from transformers import AutoModelForCausalLM, LlamaConfig

  from morse_jax import llm

  torch.manual_seed(0)
  hf_config = LlamaConfig(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=0,
                          tie_word_embeddings=False)
  torch_dtype = getattr(torch, dtype_name)
  hf_model = AutoModelForCausalLM.from_config(hf_config).eval().to(torch_dtype)
  with tempfile.TemporaryDirectory() as folder:
    hf_model.save_pretrained(folder)
    model = llm.load(folder)
  prompts = np.random.RandomState(0).randint(1, shape["vocab_size"], (ROWS, PROMPT))
  settings = MODES[mode]
  sampling = llm.SamplingConfig(temperature=settings["temperature"], top_p=settings["top_p"])

  def ours():
    llm.sample(model.params, model.config, prompts.tolist(), max_new_tokens=NEW,
               rng=jax.random.key(0), sampling=sampling)

  gen_kwargs = dict(max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
  if settings["temperature"] == 0:
    gen_kwargs.update(do_sample=False)
  else:
    gen_kwargs.update(do_sample=True, temperature=settings["temperature"], top_p=settings["top_p"],
                      top_k=0)
  input_ids = torch.tensor(prompts)
  attention_mask = torch.ones_like(input_ids)

  def theirs():
    with torch.no_grad():
      out = hf_model.generate(input_ids=input_ids, attention_mask=attention_mask, **gen_kwargs)
    assert out.shape == (ROWS, PROMPT + NEW), out.shape

  start = time.perf_counter()
  ours()
  compile_s = time.perf_counter() - start
  theirs()
  our_s, their_s = _time(ours, repeats), _time(theirs, repeats)
  tokens = ROWS * NEW
  return {
      "case": f"{name}/{mode}", "model": name, "mode": mode, "dtype": dtype_name,
      "params": model.config.num_params(), "rows": ROWS, "prompt_tokens": PROMPT,
      "new_tokens": NEW, "ours_tokens_per_s": tokens / our_s,
      "transformers_tokens_per_s": tokens / their_s,
      "ratio_vs_transformers": their_s / our_s, "ours_first_call_s": compile_s,
  }


def main(argv):
  del argv
  models = ["tiny"] if _QUICK.value else list(MODELS)
  repeats = 1 if _QUICK.value else _REPEATS.value
  results = []
  for name in models:
    for mode in MODES:
      results.append(run_case(name, MODELS[name], mode, repeats, _DTYPE.value))
      r = results[-1]
      print(f"{r['case']:<24} ours {r['ours_tokens_per_s']:9.1f} tok/s   transformers "
            f"{r['transformers_tokens_per_s']:9.1f} tok/s   ratio {r['ratio_vs_transformers']:5.2f}x"
            f"   (first call {r['ours_first_call_s']:.1f}s)", flush=True)
  write_report("rollout", _OUT.value, results=results)


if __name__ == "__main__":
  app.run(main)
