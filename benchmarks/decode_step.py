"""One decode step of our sampler on a real model: milliseconds, the memory floor, and where the
time goes.

  python -m benchmarks.decode_step [--model=DIR] [--rows=8] [--prompt=350] [--new=256]

- `step_ms`: `generate_padded` compiled once for the prompt bucket and `--new` tokens, run for 1
  and for `--new` tokens (`max_new` is traced: the same program and cache size), divided by the
  difference. EOS is off, so every row decodes every step.
- `floor_ms`: the bytes one step must read (every weight once; the head is the tied embedding)
  over this machine's read bandwidth measured in the same run (the faster of a jitted sum and
  numpy's sum over 1 GiB). `floor_with_cache_ms` adds the KV cache each step reads.
- `profile_ms`, where a step's time goes: `attention` is the step minus the same step with the
  attention's cache reads removed; `projections` (the layers' fused [in, out] matmuls) and
  `head_and_choice` (final norm, tied head, greedy choice) are those parts run alone on the
  same weights, 32 steps in a loop; `rest` is what remains (norms, RoPE, cache writes, the
  loop's bookkeeping).
"""

from __future__ import annotations

import os
import time

from absl import app, flags

STEPS = 32  # steps per timed loop in `profile`


def read_bandwidth_gbs(nbytes: int = 1 << 30) -> dict:
  """GB/s of one read pass: a jitted sum and numpy's sum over `nbytes` of float32, best of 3."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  host = np.ones(nbytes // 4, np.float32)
  dev = jnp.asarray(host)
  total = jax.jit(jnp.sum)
  total(dev).block_until_ready()
  out = {}
  for name, fn in (("xla_sum", lambda: total(dev).block_until_ready()), ("numpy_sum", host.sum)):
    best = min(_seconds(fn) for _ in range(3))
    out[name] = nbytes / best / 1e9
  out["best"] = max(out.values())
  return out


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def weight_bytes(params) -> int:
  import jax

  return sum(a.nbytes for a in jax.tree.leaves(params))


def cache_bytes(config, rows: int, slots: int, itemsize: int = 4) -> int:
  return 2 * config.num_layers * rows * config.num_kv_heads * slots * config.head_dim * itemsize


def step_ms(model, prompts, new: int, sampling=None, repeats: int = 3,
            unstack: bool | None = None) -> dict:
  """ms per decode step and the prefill (+ first step) seconds, from `new` and 1 tokens.
  unstack: the decode loop's layout (`GenerationSettings.unstack`; None: `default_unstack`'s
  choice)."""
  import jax
  import jax.numpy as jnp

  from morse_jax import llm
  from morse_jax.llm import model as model_lib
  from morse_jax.llm import sampling as sampling_lib

  sampling = sampling or llm.GREEDY
  rows = len(prompts)
  p = sampling_lib.length_bucket(max(len(x) for x in prompts))
  tokens, mask = sampling_lib.left_pad(prompts, p, rows, 0)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(rows))
  bits = model_lib.bits_view(model.params)  # as `llm.sample` runs it
  if unstack is None:
    unstack = sampling_lib.default_unstack(model.params)
  settings = llm.GenerationSettings(sampling_lib.bucket(new), sampling, unstack=unstack)

  def run(n):
    out = sampling_lib.generate_padded(
        model.params, model.config, jnp.asarray(tokens), jnp.asarray(mask), keys, jnp.int32(n),
        settings, bits=bits)
    return jax.block_until_ready(out)

  run(1)  # compile
  one = min(_seconds(lambda: run(1)) for _ in range(repeats))
  full = min(_seconds(lambda: run(new)) for _ in range(repeats))
  return {"step_ms": 1000 * (full - one) / (new - 1), "prefill_and_first_step_s": one,
          "prompt_bucket": p, "cache_slots": p + settings.max_new_tokens,
          "fused_decode_layout": unstack}


def profile(model, prompts, new: int, full_ms: float) -> dict:
  """ms per step of each part of a decode step (see the module docstring)."""
  import jax
  import jax.numpy as jnp

  from morse_jax.llm import fused_decode
  from morse_jax.llm import model as model_lib
  from morse_jax.llm import sampling as sampling_lib

  c, rows = model.config, len(prompts)
  real_attention = model_lib._attention
  model_lib._attention = lambda q, k, v, vis, config: (  # decode steps only: not the prefill
      q.reshape(q.shape[0], 1, -1) if q.shape[1] == 1 else real_attention(q, k, v, vis, config))
  jax.clear_caches()  # retrace without the cache reads
  try:
    without_attention = step_ms(model, prompts, new)["step_ms"]
  finally:
    model_lib._attention = real_attention
    jax.clear_caches()
  args = {"layers": fused_decode.decode_layers(model.params.layers),  # arguments, not constants
          "head": model.params.embed if model.params.lm_head is None else model.params.lm_head,
          "final_norm": model.params.final_norm}

  def dot(spec, x, w):  # as the model's products: f32 accumulation, back to the input's type
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(x.dtype)

  def projections(x, a):
    for lp in a["layers"]:
      q, _, _ = fused_decode.FUSED.qkv(x, lp, None, None, c)
      x = x + dot("btd,od->bto", q.astype(x.dtype), lp.wo)
      gate, up = jnp.split(dot("btd,fd->btf", x, lp.w_gate_up), 2, axis=-1)
      x = x + dot("btf,df->btd", jax.nn.silu(gate) * up, lp.w_down) * 0.01
    return x

  def head(x, a):
    h = model_lib.rms_norm(x, a["final_norm"], c.rms_norm_eps)
    logits = jnp.einsum("btd,vd->btv", h, a["head"], preferred_element_type=jnp.float32)
    token, _ = sampling_lib._choose(logits[:, -1], None, 0, sampling_lib.GREEDY)
    return x + token[:, None, None].astype(x.dtype) * 1e-9

  x0 = jnp.full((rows, 1, c.hidden_size), 0.01, model.params.embed.dtype)
  out = {"attention": full_ms - without_attention}
  for name, part in (("projections", projections), ("head_and_choice", head)):
    loop = jax.jit(lambda x, a, part=part: jax.lax.fori_loop(
        0, STEPS, lambda i, x: part(x, a), x))
    jax.block_until_ready(loop(x0, args))
    out[name] = 1000 * min(_seconds(lambda: jax.block_until_ready(loop(x0, args)))
                           for _ in range(3)) / STEPS
  out["rest"] = full_ms - sum(out.values())  # norms, RoPE, cache writes, the loop's bookkeeping
  return out


def measure(model, prompts, new: int, sampling=None, with_profile: bool = True,
            unstack: bool | None = None, repeats: int = 3) -> dict:
  """step_ms, the floor and (optionally) the profile for one batch of prompts."""
  result = step_ms(model, prompts, new, sampling, repeats, unstack)
  bw = read_bandwidth_gbs()
  weights = weight_bytes(model.params)
  kv = cache_bytes(model.config, len(prompts), result["cache_slots"],
                   model.params.embed.dtype.itemsize)
  result.update({
      "read_bandwidth_gbs": bw, "weight_bytes": weights, "cache_bytes": kv,
      "floor_ms": 1000 * weights / (bw["best"] * 1e9),
      "floor_with_cache_ms": 1000 * (weights + kv) / (bw["best"] * 1e9)})
  result["step_over_floor"] = result["step_ms"] / result["floor_ms"]
  if with_profile:
    result["profile_ms"] = profile(model, prompts, new, result["step_ms"])
  return result


def main(argv):
  del argv
  import jax.numpy as jnp
  import numpy as np

  from morse_jax import llm

  f = flags.FLAGS
  model = llm.load(os.path.expanduser(f.model), dtype=getattr(jnp, f.dtype))
  prompts = np.random.RandomState(0).randint(5, model.config.vocab_size,
                                             (f.rows, f.prompt)).tolist()
  layout = {"auto": None, "fused": True, "stacked": False}[f.layout]
  r = measure(model, prompts, f.new, with_profile=f.profile, unstack=layout, repeats=f.repeats)
  print(f"{r['step_ms']:.1f} ms per decode step ({f.rows} rows, {f.prompt}-token "
        f"prompts, {r['cache_slots']} cache slots); floor {r['floor_ms']:.1f} ms "
        f"({r['weight_bytes'] / 1e6:.0f} MB at {r['read_bandwidth_gbs']['best']:.1f} GB/s), "
        f"{r['step_over_floor']:.2f}x; with the cache {r['floor_with_cache_ms']:.1f} ms; "
        f"fused decode layout: {r['fused_decode_layout']}")
  if f.profile:
    print("profile (ms per step):", {k: round(v, 1) for k, v in r["profile_ms"].items()})


if __name__ == "__main__":
  flags.DEFINE_string("model", "~/.cache/morse_jax/models/SmolLM2-135M-Instruct",
                      "Hugging Face folder or .gguf file.")
  flags.DEFINE_integer("rows", 8, "Rows per call.")
  flags.DEFINE_integer("prompt", 350, "Prompt tokens per row.")
  flags.DEFINE_integer("new", 256, "Generated tokens.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights.")
  flags.DEFINE_enum("layout", "auto", ["auto", "fused", "stacked"],
                    "The decode loop's weights: fused_decode's per-layer copies, the stored "
                    "stacked ones, or the default's choice (fused where the copy fits).")
  flags.DEFINE_bool("profile", True, "Also measure where a step's time goes.")
  flags.DEFINE_integer("repeats", 3, "Timed runs per length (the fastest counts).")
  app.run(main)
