"""The ragged generation workload: the engine (`llm.engine`) against today's static sampler.

  python -m benchmarks.ragged --model=smollm2 --requests=128 --out=FILE

Requests: single-agent HumanEval executor prompts (chat template, our tokenizer), each with a
reply length drawn (seeded) from our recorded HumanEval replies of Qwen2.5-Coder-1.5B
(`benchmarks/results/qwen25_coder/humaneval_single`, 164 replies of 37 to 512 tokens, the
512 being the run's cap). Every request generates exactly its drawn length (no stop ids), so
both sides do the same useful work whatever the backbone would say. Greedy.

Static: `llm.sample` on batches of `--slots` requests in arrival order, each run to its longest
reply (as today's callers batch: a wave, a turn). Engine: the same requests submitted at once to
an engine of `--slots` slots. Reported per side: wall seconds, the seconds XLA spent compiling
(jax's compile events), generated tokens/s with and without them, the share of computed row
tokens that were padding, and for the engine the KV bytes held against the tokens live (sampled
after every step) and its peak. `greedy_equal`: every request's tokens equal on both sides.
transformers' batched `generate` (`--transformers`, on by default for a model folder) runs
the static side's batches left-padded with greedy `generate` at `--torch_threads` threads
(`ratio_vs_transformers`, `transformers_greedy_equal`). Sides run one after the other (engine,
static, transformers) and the report is written after each, so a long run keeps what it did.
Where a side's greedy tokens part from the engine's (bfloat16 rounds each program its own way),
`divergences_vs_<side>` says where and whether the two tokens were a near-tie in float32.
"""

from __future__ import annotations

import glob
import json
import os
import time

# torch's OpenMP workers otherwise spin after each generate call, taking the cores from the
# next side (as in benchmarks.rollout)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from absl import app, flags

from benchmarks.common import bench_model, model_folder, write_report

REPLIES = "benchmarks/results/qwen25_coder/humaneval_single/*.jsonl"


def recorded_reply_lengths() -> list[int]:
  lengths = []
  for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", REPLIES))):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    lengths += [r["generated_tokens"] for r in rows if r.get("kind") == "node"]
  if not lengths:
    raise FileNotFoundError(f"no recorded replies at {REPLIES}")
  return lengths


def workload(model, n: int, seed: int, cap: int):
  """(prompts, reply lengths): HumanEval prompts in order (cycled), lengths drawn with seed."""
  import numpy as np

  from benchmarks.common import single_agent_prompts
  from morse_jax.tasks import humaneval

  prompts = single_agent_prompts(model, humaneval.HumanEval(), humaneval.load())
  lengths = np.random.default_rng(seed).choice(recorded_reply_lengths(), size=n)
  return [prompts[i % len(prompts)] for i in range(n)], [int(min(x, cap)) for x in lengths]


class CompileClock:
  """Seconds XLA spends compiling while active."""

  def __init__(self):
    import jax

    self.seconds, self.count, self.active = 0.0, 0, False
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, name, duration, **_):
    if self.active and name == "/jax/core/compile/backend_compile_duration":
      self.seconds += duration
      self.count += 1

  def __enter__(self):
    self.seconds, self.count, self.active = 0.0, 0, True
    return self

  def __exit__(self, *_):
    self.active = False


def run_static(model, prompts, lengths, slots: int) -> dict:
  import jax

  from morse_jax import llm

  tokens, logprobs, computed = [], [], 0
  with CompileClock() as clock:
    start = time.perf_counter()
    for i in range(0, len(prompts), slots):
      batch, budgets = prompts[i:i + slots], lengths[i:i + slots]
      settings = llm.GenerationSettings(max(budgets), llm.GREEDY, eos_ids=(),
                                        pad_id=model.pad_id)
      out = llm.sample(model, batch, settings, rng=jax.random.key(0))
      tokens += [out.tokens[j, :b].tolist() for j, b in enumerate(budgets)]
      logprobs += [out.logprobs[j, :b].tolist() for j, b in enumerate(budgets)]
      computed += len(batch) * max(budgets)  # every row runs to the batch's longest
    wall = time.perf_counter() - start
  return _side(wall, clock, sum(lengths), computed) | {"tokens": tokens,
                                                        "logprobs": logprobs}


def run_engine(model, prompts, lengths, slots: int, steps_per_call: int = 8,
               prefill_chunk: int = 128) -> dict:
  from morse_jax import llm
  from morse_jax.llm.engine import Engine, EngineConfig, Request

  psize = 16
  longest = max(len(p) + n for p, n in zip(prompts, lengths))
  config = EngineConfig(slots=slots, max_len=-(-longest // psize) * psize, page_size=psize,
                        steps_per_call=steps_per_call, prefill_chunk=prefill_chunk)
  engine = Engine(model, config)
  samples, peak = [], {"bytes_held": 0}
  with CompileClock() as clock:
    start = time.perf_counter()
    handles = [engine.submit(Request(p, n, llm.GREEDY, stop_ids=()))
               for p, n in zip(prompts, lengths)]
    while engine.step():
      usage = engine.kv_usage()
      samples.append(usage)
      peak = max(peak, usage, key=lambda u: u["bytes_held"])
    wall = time.perf_counter() - start
  tokens = [h.result().tokens.tolist() for h in handles]
  logprobs = [h.result().logprobs.tolist() for h in handles]
  s = engine.stats
  held = sum(u["bytes_held"] for u in samples)
  live = sum(u["bytes_live"] for u in samples)
  ratio = max(u["slots_held"] / max(1.25 * u["tokens_live"] + psize * u["rows"], 1)
              for u in samples if u["rows"])
  return _side(wall, clock, sum(lengths), s["decode_computed"]) | {
      "tokens": tokens, "logprobs": logprobs, "config": {k: getattr(config, k) for k in (
          "slots", "max_len", "page_size", "steps_per_call", "min_decode_rows", "prefill_chunk",
          "prefill_rows", "block_pages")},
      "decode_calls": s["decode_calls"], "prefill_calls": s["prefill_calls"],
      "prefill_padding_share": 1 - s["prefill_tokens"] / max(s["prefill_computed"], 1),
      "kv_bytes_held_over_live_mean": held / max(live, 1),
      "kv_peak": peak, "kv_pool_bytes": engine.pool.nbytes,
      "kv_bound_worst": ratio}  # held / (1.25 live + a page per row): <= 1 is the goal


def _side(wall: float, clock: CompileClock, useful: int, computed: int) -> dict:
  return {"seconds": wall, "compile_seconds": clock.seconds, "compiles": clock.count,
          "tokens_generated": useful, "tokens_per_s": useful / wall,
          "tokens_per_s_without_compiles": useful / max(wall - clock.seconds, 1e-9),
          "row_tokens_computed": computed, "padding_share": 1 - useful / computed}


def run_transformers(folder: str, dtype_name: str, prompts, lengths, slots: int, pad_id: int,
                     threads: int = 2) -> dict:
  """transformers' batched greedy generate on the static side's batches, left-padded."""
  import torch
  from transformers import AutoModelForCausalLM

  torch.set_num_threads(threads)
  hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name)).eval()
  tokens, computed = [], 0
  start = time.perf_counter()
  for i in range(0, len(prompts), slots):
    batch, budgets = prompts[i:i + slots], lengths[i:i + slots]
    width = max(map(len, batch))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.no_grad():
      out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(budgets),
                        min_new_tokens=max(budgets), eos_token_id=None, pad_token_id=pad_id,
                        do_sample=False)
    tokens += [out[j, width:width + b].tolist() for j, b in enumerate(budgets)]
    computed += len(batch) * max(budgets)
  wall = time.perf_counter() - start
  return {"seconds": wall, "tokens_generated": sum(lengths), "tokens_per_s": sum(lengths) / wall,
          "row_tokens_computed": computed, "padding_share": 1 - sum(lengths) / computed,
          "torch_threads": threads, "tokens": tokens}


def logprob_noise(ours, theirs, ours_logp, theirs_logp) -> float:
  """The largest difference between two sides' log-probs of the tokens they agree on (each
  request up to where its tokens part): how far apart the two programs' numbers are."""
  noise = 0.0
  for a, b, la, lb in zip(ours, theirs, ours_logp, theirs_logp):
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    noise = max([noise] + [abs(x - y) for x, y in zip(la[:same], lb[:same])])
  return noise


def divergences(model, prompts, ours, theirs, noise: float | None = None) -> list[dict]:
  """Where two sides' greedy tokens part, each explained or not: for every request whose tokens
  differ, its first differing position `at`, the two tokens, and their logits there in float32
  (the model's weights cast to float32, exactly; the prompt and the shared reply prefix through
  `llm.forward`). `gap`: the two logits' difference; `spacing`: bfloat16's spacing at the
  larger one (2^(e - 7)); `near_tie`: the gap within the larger of that spacing and `noise`
  (`logprob_noise`: how far the two sides' numbers already differ where they agree), so that
  either side's choice is a rounding's. A request whose replies differ only in length has `at`
  = the shorter length and no logits."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from morse_jax import llm

  f32 = lambda a: a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a
  params = jax.tree.map(f32, model.params)
  last = jax.jit(lambda p, t: llm.forward(p, model.config, t, last_only=True)[0][0, -1])
  out = []
  for r, (prompt, a, b) in enumerate(zip(prompts, ours, theirs)):
    if a == b:
      continue
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    row = {"request": r, "at": at}
    if at < min(len(a), len(b)):
      logits = np.asarray(last(params, jnp.asarray([list(prompt) + a[:at]], jnp.int32)))
      la, lb = float(logits[a[at]]), float(logits[b[at]])
      spacing = float(2.0 ** (np.floor(np.log2(max(abs(la), abs(lb), 1e-30))) - 7))
      row |= {"tokens": [a[at], b[at]], "logits": [la, lb], "gap": abs(la - lb),
              "spacing": spacing, "near_tie": bool(abs(la - lb) <= max(spacing, noise or 0.0)),
              "f32_argmax": int(np.argmax(logits))}
    out.append(row)
  return out


def report(fields: dict, sides: dict, tokens: dict) -> dict:
  """The JSON fields of the sides run so far (ratios against the engine, greedy equality)."""
  out = {**fields, **sides}
  engine = sides["engine"]
  for name in ("static", "transformers"):
    out[f"ratio_vs_{name}"] = (engine["tokens_per_s"] / sides[name]["tokens_per_s"]
                               if name in sides else None)
  if "static" in sides:
    out["ratio_vs_static_without_compiles"] = (engine["tokens_per_s_without_compiles"]
                                               / sides["static"]["tokens_per_s_without_compiles"])
  for name in ("static", "transformers"):
    if name in tokens:
      equal = [a == b for a, b in zip(tokens["engine"], tokens[name])]
      key = "greedy" if name == "static" else "transformers_greedy"
      out[f"{key}_equal"], out[f"{key}_rows_equal"] = all(equal), sum(equal)
  return out


def main(_):
  f = flags.FLAGS
  model = bench_model(f.model, f.dtype)
  prompts, lengths = workload(model, f.requests, f.seed, f.max_reply)
  if f.reply_tokens:  # every reply this long (1: the prompts' prefill, timed alone)
    lengths = [f.reply_tokens] * len(prompts)
  print(f"{len(prompts)} requests, prompts {min(map(len, prompts))}..{max(map(len, prompts))} "
        f"tokens, replies {min(lengths)}..{max(lengths)} (sum {sum(lengths)})", flush=True)
  fields = dict(
      model=f.model, dtype=f.dtype, requests=len(prompts), slots=f.slots,
      reply_lengths={"source": f"fixed at {f.reply_tokens}" if f.reply_tokens else REPLIES,
                     "seed": f.seed, "cap": f.max_reply,
                     "sum": sum(lengths), "min": min(lengths), "max": max(lengths)},
      prompt_tokens={"min": min(map(len, prompts)), "max": max(map(len, prompts))})
  folder = model_folder(f.model)
  runs = [("engine", lambda: run_engine(model, prompts, lengths, f.slots, f.steps_per_call,
                                       f.prefill_chunk))]
  if f.static:
    runs.append(("static", lambda: run_static(model, prompts, lengths, f.slots)))
  if f.transformers and folder:
    runs.append(("transformers", lambda: run_transformers(
        folder, f.dtype, prompts, lengths, f.slots, model.pad_id,
        f.torch_threads)))
  sides, tokens, logprobs, parted = {}, {}, {}, {}
  for name, run in runs:
    side = run()
    tokens[name], logprobs[name] = side.pop("tokens"), side.pop("logprobs", None)
    sides[name] = side
    print(name, side, flush=True)
    if name != "engine" and f.divergences:
      noise = None if logprobs[name] is None else logprob_noise(
          tokens["engine"], tokens[name], logprobs["engine"], logprobs[name])
      parted[f"logprob_noise_vs_{name}"] = noise
      parted[f"divergences_vs_{name}"] = divergences(model, prompts, tokens["engine"],
                                                     tokens[name], noise)
    write_report("ragged", f.out, **report(fields, sides, tokens), **parted)


if __name__ == "__main__":
  # flags defined here, not at import: tests import this module beside launchers that define
  # --model too (absl flags are process-wide)
  flags.DEFINE_string("model", "smollm2", "smollm2, a Hugging Face folder, tiny or a name in "
                      "llm.presets.ARCHITECTURES (random weights).")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights and cache.")
  flags.DEFINE_bool("static", True, "Also the static sampler (--nostatic: the engine alone).")
  flags.DEFINE_bool("transformers", True, "Also transformers' generate (model folders only).")
  flags.DEFINE_integer("torch_threads", 2, "torch threads of the transformers side.")
  flags.DEFINE_integer("requests", 128, "Requests in the workload.")
  flags.DEFINE_integer("slots", 16, "Engine slots = the static sampler's batch rows.")
  flags.DEFINE_integer("seed", 0, "Seed of the reply-length draw.")
  flags.DEFINE_integer("max_reply", 512, "Cap on a drawn reply length.")
  flags.DEFINE_integer("reply_tokens", 0, "Every reply this many tokens instead of the drawn "
                       "lengths (1: the prompts' prefill alone); 0: drawn.")
  flags.DEFINE_integer("steps_per_call", 8, "Engine tokens per row per host round trip.")
  flags.DEFINE_integer("prefill_chunk", 128, "Engine prefill chunk.")
  flags.DEFINE_bool("divergences", True, "Where the sides' greedy tokens part: the two tokens' "
                    "float32 logits there (`divergences`).")
  flags.DEFINE_string("out", None, "Write the report as JSON to this file.")
  app.run(main)
