"""The real-model cases of `benchmarks.rollout`: SmolLM2-135M-Instruct, ours against
transformers' `generate` on the same files and prompts (see benchmarks/rollout.py)."""

from __future__ import annotations

import os
import time

ROWS, PROMPT_TOKENS, NEW = (8, 32), (64, 350), 256
MODES = {"greedy": dict(temperature=0.0, top_p=1.0), "top_p_0.9": dict(temperature=1.0, top_p=0.9)}
PROFILE_AT = (8, 350)  # the shape whose decode step is broken down


def humaneval_prompts(model, rows: int, length: int) -> list[list[int]]:
  """`rows` single-agent HumanEval executor prompts (chat template included) of at least
  `length` tokens, each cut to its last `length` (it still ends with the assistant header)."""
  from benchmarks.common import single_agent_prompts
  from morse_jax.tasks import humaneval

  family = humaneval.HumanEval()
  long_enough = [p for p in single_agent_prompts(model, family, humaneval.load())
                 if len(p) >= length]
  if len(long_enough) < rows:
    raise ValueError(f"only {len(long_enough)} HumanEval prompts have {length} tokens")
  return [p[-length:] for p in long_enough[:rows]]


def same_tokens(ours, theirs) -> dict:
  """Rows whose greedy tokens are equal, and the first position where any row differs."""
  import numpy as np

  diff = np.asarray(ours) != np.asarray(theirs)
  first = [int(np.argmax(row)) if row.any() else diff.shape[1] for row in diff]
  return {"rows_equal": int((~diff.any(axis=1)).sum()), "rows": int(diff.shape[0]),
          "first_difference": min(first)}


def run_case(model, hf, rows: int, length: int, mode: str, repeats: int) -> dict:
  import jax
  import torch

  from benchmarks import decode_step
  from benchmarks.common import median_seconds
  from morse_jax import llm

  prompts = humaneval_prompts(model, rows, length)
  settings = MODES[mode]
  sampling = llm.SamplingConfig(temperature=settings["temperature"], top_p=settings["top_p"])

  def ours():
    return llm.sample(model, prompts, llm.GenerationSettings(NEW, sampling),
                      rng=jax.random.key(0))

  gen = dict(max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
             pad_token_id=model.tokenizer.pad_id)
  if sampling.greedy:
    gen.update(do_sample=False)
  else:
    gen.update(do_sample=True, temperature=settings["temperature"], top_p=settings["top_p"],
               top_k=0)
  ids = torch.tensor(prompts)
  out = {}

  def theirs():
    with torch.no_grad():
      out["tokens"] = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)

  start = time.perf_counter()
  first = ours()
  compile_s = time.perf_counter() - start
  our_s = median_seconds(ours, repeats)  # before torch runs at all in this case
  with torch.no_grad():  # warm-up
    hf.generate(input_ids=ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]),
                **{**gen, "max_new_tokens": 2, "min_new_tokens": 2})
  their_s = median_seconds(theirs, max(1, repeats - 1))  # ~1 minute per call
  tokens = rows * NEW
  result = {
      "case": f"smollm2/{rows}x{length}/{mode}", "model": "SmolLM2-135M-Instruct", "mode": mode,
      "dtype": str(model.params.embed.dtype), "params": model.config.num_params(), "rows": rows,
      "prompt_tokens": length, "new_tokens": NEW, "ours_tokens_per_s": tokens / our_s,
      "transformers_tokens_per_s": tokens / their_s, "ratio_vs_transformers": their_s / our_s,
      "ours_first_call_s": compile_s}
  if sampling.greedy:
    result["same_greedy_tokens"] = same_tokens(first.tokens, out["tokens"][:, length:].numpy())
    result["decode_step"] = decode_step.measure(model, prompts, NEW,
                                                with_profile=(rows, length) == PROFILE_AT)
  return result


def run_all(folder: str, repeats: int, dtype_name: str, only=()):
  """Yields each case's result (rows x prompt length x mode); `only`: names ROWSxPROMPT/MODE to
  run (every case when empty)."""
  import jax.numpy as jnp
  import torch
  from transformers import AutoModelForCausalLM

  from morse_jax import llm

  folder = os.path.expanduser(folder)
  model = llm.load(folder, dtype=getattr(jnp, dtype_name))
  hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name)).eval()
  names = [(rows, length, mode) for rows in ROWS for length in PROMPT_TOKENS for mode in MODES]
  unknown = set(only) - {f"{r}x{n}/{m}" for r, n, m in names}
  if unknown:
    raise ValueError(f"--cases: unknown {sorted(unknown)}; known ROWSxPROMPT/MODE with ROWS in "
                     f"{ROWS}, PROMPT in {PROMPT_TOKENS}, MODE in {tuple(MODES)}")
  for rows, length, mode in names:
    if not only or f"{rows}x{length}/{mode}" in only:
      yield run_case(model, hf, rows, length, mode, repeats)


QWEN_ROWS, QWEN_PROMPT, QWEN_NEW = (8, 32), 350, 64


def peak_rss_reset() -> int:
  """Resets the process's peak resident set (VmHWM) to the current one; returns it (bytes)."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
  return _status("VmHWM")


def _status(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise KeyError(field)


def run_qwen(folder: str, repeats: int, dtype_name: str, rows_list=QWEN_ROWS,
             length: int = QWEN_PROMPT, new: int = QWEN_NEW, label: str = "qwen"):
  """Qwen2.5-Coder-1.5B-Instruct, greedy: our cases first (tokens per second, the decode step
  against its floor, the peak resident memory of our generate call against weights + cache),
  then our model freed and transformers' read for the same prompts (never both alive: 7 GB
  each in float32), tokens compared row by row."""
  import gc

  import jax
  import jax.numpy as jnp
  import torch
  from transformers import AutoModelForCausalLM

  from benchmarks import decode_step
  from benchmarks.common import median_seconds
  from morse_jax import llm
  from morse_jax.llm import sampling as sampling_lib

  folder = os.path.expanduser(folder)
  model = llm.load(folder, dtype=getattr(jnp, dtype_name))
  weights = decode_step.weight_bytes(model.params)
  results, prompts_of, tokens_of = [], {}, {}
  for rows in rows_list:
    prompts = prompts_of[rows] = humaneval_prompts(model, rows, length)

    def ours():
      return llm.sample(model, prompts, llm.GenerationSettings(new, llm.GREEDY),
                        rng=jax.random.key(0))

    before = peak_rss_reset()
    start = time.perf_counter()
    tokens_of[rows] = ours().tokens
    compile_s = time.perf_counter() - start
    our_s = median_seconds(ours, repeats)
    peak = _status("VmHWM")
    slots = sampling_lib.length_bucket(length) + sampling_lib.bucket(new)
    cache = decode_step.cache_bytes(model.config, rows, slots, model.params.embed.dtype.itemsize)
    results.append({
        "case": f"{label}/{rows}x{length}/greedy/{dtype_name}", "model": os.path.basename(folder),
        "mode": "greedy", "dtype": dtype_name, "params": model.config.num_params(), "rows": rows,
        "prompt_tokens": length, "new_tokens": new, "ours_tokens_per_s": rows * new / our_s,
        "ours_first_call_s": compile_s,
        "fused_decode_layout": sampling_lib.default_unstack(model.params),
        "memory": {"weight_bytes": weights, "cache_bytes": cache, "rss_before_bytes": before,
                   "peak_rss_bytes": peak, "added_by_generate_bytes": peak - before,
                   "peak_over_weights_and_cache": (weights + peak - before) / (weights + cache)},
        "decode_step": decode_step.measure(model, prompts, new, with_profile=False)})
  del model
  gc.collect()
  hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name)).eval()
  pad = hf.generation_config.pad_token_id or 0
  for result in results:
    rows = result["rows"]
    ids = torch.tensor(prompts_of[rows])
    out = {}

    def theirs():
      with torch.no_grad():
        out["tokens"] = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                                    pad_token_id=pad, do_sample=False)

    their_s = median_seconds(theirs, max(1, repeats - 1))
    result["transformers_tokens_per_s"] = rows * new / their_s
    result["ratio_vs_transformers"] = result["ours_tokens_per_s"] / result[
        "transformers_tokens_per_s"]
    result["same_greedy_tokens"] = same_tokens(tokens_of[rows],
                                               out["tokens"][:, length:].numpy())
    yield result
