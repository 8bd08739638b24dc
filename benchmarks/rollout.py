"""Generated tokens per second: our sampler against transformers' `generate`, same weights, one run.

  python -m benchmarks.rollout [--models=smollm2,tiny,llama_100m] [--out FILE] [--quick]
                               [--dtype float32|bfloat16] [--cases=32x350/top_p_0.9]

`smollm2`: the real SmolLM2-135M-Instruct (`make real-model`'s folder), read by both sides from
the same files. Prompts are HumanEval executor prompts as `launchers.evaluate` builds them (chat
template included), each cut to its last 64 or 350 tokens; 8 and 32 rows, 256 new tokens, greedy
and top-p 0.9, EOS off so both sides generate every token. Greedy cases check that both sides
chose the same tokens (rows equal, first position where any row differs) and measure one decode
step against the memory floor (`benchmarks.decode_step`: ms per step, weight bytes over the read
bandwidth measured in the same run; at 8 rows x 350 tokens also where the step's time goes).

`qwen`: Qwen2.5-Coder-1.5B-Instruct (`make real-model-qwen`'s folder), greedy only, 8 and 32 rows
(`--qwen_rows`) x 350-token prompts x 64 new tokens in `--dtype`; ours runs first and is freed
before transformers reads the model (`rollout_real.run_qwen`); each case also reports the peak
resident memory of our generate call against weights + cache.

`tiny`, `llama_100m`: random models built by transformers (seeded) and saved, 16 rows x 64-token
prompts x 128 new tokens. Our compile is excluded (paid once per bucket), and so is a first
transformers call (warm-up).
"""

from __future__ import annotations

import os
import tempfile
import time

# torch's OpenMP workers otherwise spin for a while after each generate call, taking the cores
# from our sampler timed next in the same process (measured: ours 1.7x slower right after one)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from absl import app, flags

from benchmarks.common import median_seconds, write_report

_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this file.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny model only, fewer repeats.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per side (median reported).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights on both sides.")
_MODELS = flags.DEFINE_list("models", ["smollm2", "tiny", "llama_100m"],
                            "Cases to run: smollm2, qwen and any of MODELS (llama_1b: "
                            "accelerators).")
_QWEN = flags.DEFINE_string("qwen_model", "~/.cache/morse_jax/models/Qwen2.5-Coder-1.5B-Instruct",
                            "The qwen case's Hugging Face folder (make real-model-qwen).")
_QWEN_ROWS = flags.DEFINE_list("qwen_rows", ["8", "32"], "The qwen case's rows per call.")
_REAL = flags.DEFINE_string("real_model", "~/.cache/morse_jax/models/SmolLM2-135M-Instruct",
                            "The smollm2 case's Hugging Face folder.")
_THREADS = flags.DEFINE_integer("threads", 0, "torch threads (0: torch's default).")
_CASES = flags.DEFINE_list("cases", [], "Only these SmolLM2 cases, ROWSxPROMPT/MODE (e.g. "
                           "32x350/top_p_0.9); empty: every one.")

ROWS, PROMPT, NEW = 16, 64, 128

MODELS = {
    # ~0.5M parameters: sampler overhead dominates.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    # ~110M parameters, Llama-shaped (GQA, SwiGLU, untied head).
    "llama_100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4),
    # ~1.2B parameters, Llama-shaped: for accelerators (benchmarks/device.sh), not in the default.
    "llama_1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8),
}
MODES = {"greedy": dict(temperature=0.0, top_p=1.0), "sample_top_p": dict(temperature=1.0, top_p=0.9)}


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
    llm.sample(model, prompts.tolist(), llm.GenerationSettings(NEW, sampling),
               rng=jax.random.key(0))

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
  our_s, their_s = median_seconds(ours, repeats), median_seconds(theirs, repeats)
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
  import torch

  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  models = ["tiny"] if _QUICK.value else list(_MODELS.value)
  repeats = 1 if _QUICK.value else _REPEATS.value
  results = []
  for name in models:
    if name == "smollm2":
      from benchmarks import rollout_real

      cases = rollout_real.run_all(_REAL.value, repeats, _DTYPE.value, _CASES.value)
    elif name == "qwen":
      from benchmarks import rollout_real

      cases = rollout_real.run_qwen(_QWEN.value, repeats, _DTYPE.value,
                                    [int(r) for r in _QWEN_ROWS.value])
    else:
      cases = (run_case(name, MODELS[name], mode, repeats, _DTYPE.value) for mode in MODES)
    for r in cases:
      results.append(r)
      print(f"{r['case']:<24} ours {r['ours_tokens_per_s']:9.1f} tok/s   transformers "
            f"{r['transformers_tokens_per_s']:9.1f} tok/s   ratio {r['ratio_vs_transformers']:5.2f}x"
            f"   (first call {r['ours_first_call_s']:.1f}s)", flush=True)
      if "memory" in r:
        m = r["memory"]
        print(f"{'':<24} peak resident {m['peak_rss_bytes'] / 1e9:.2f} GB, generate added "
              f"{m['added_by_generate_bytes'] / 1e9:.2f} GB: (weights + that) / (weights + cache)"
              f" = {m['peak_over_weights_and_cache']:.2f}x; greedy {r['same_greedy_tokens']}",
              flush=True)
      if "decode_step" in r:
        d = r["decode_step"]
        print(f"{'':<24} decode step {d['step_ms']:.1f} ms, floor {d['floor_ms']:.1f} ms "
              f"({d['step_over_floor']:.2f}x)" + (f", profile {d['profile_ms']}"
                                                  if "profile_ms" in d else ""), flush=True)
      write_report("rollout", _OUT.value, results=results)  # after every case: a long run


if __name__ == "__main__":
  app.run(main)
