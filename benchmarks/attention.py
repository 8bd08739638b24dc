"""Attention without a score matrix (issue 54): time and compiled temporaries of the blocked
attention (`llm.attention`) against the dense formula, for the op alone and a small model.

  python -m benchmarks.attention [--lengths=2048,8192,32768] [--dense_max=8192] [--out FILE]

Per length t (one row):
- `op`: attention alone, q [1, t, 4, 64], k / v [1, 4, t, 64], causal; forward, and forward +
  backward (d/d q, k, v of sum(out^2)).
- `model`: the 2-layer model of `SMALL` (4 heads of 64, hidden 256, vocabulary 1024):
  `llm.forward`'s logits, and the gradient of the update's next-token log-probs
  (`rl.logprobs.token_logprobs`) with respect to the embedding and layers with `remat=True`
  (each layer recomputed in the backward pass); ours computes the logits `LOGIT_CHUNK` tokens at
  a time, dense all at once (as before issue 54).
Each row gives `temp_mib` (`compile().memory_analysis().temp_size_in_bytes`: the compiled
program's temporaries, its peak beyond arguments and outputs) and the median seconds of
--repeats runs after one untimed run (one timed run above 8192 tokens). `dense` rows run the same programs with the textbook
formula (f32 scores [b, kv, g, t, s] and a [b, t, s] mask: the attention before issue 54); `ours`
is `attention_kernels.attend` (the blocked path on CPU, the platform's kernel where it covers
the case); it is
skipped above --dense_max, where its scores alone would not fit (32k: 16 GiB per score tensor).
"""

from __future__ import annotations

import contextlib

from absl import app, flags

from benchmarks.common import median_seconds, write_report

_OUT = flags.DEFINE_string("out", "benchmarks/results/attention_cpu.json", "JSON report.")
_LENGTHS = flags.DEFINE_list("lengths", ["2048", "8192", "32768"], "Tokens per row.")
_DENSE_MAX = flags.DEFINE_integer("dense_max", 8192, "Longest length the dense path runs at.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per program (median).")
_PARTS = flags.DEFINE_list("parts", ["op", "model"], "Which programs to run.")

SMALL = dict(model_type="llama", vocab_size=1024, hidden_size=256, intermediate_size=1024,
             num_layers=2, num_heads=4, num_kv_heads=4, head_dim=64)
MIB = 1 << 20


def dense_attention(q, k, v, vis):
  """The attention before issue 54: [b, t, s] mask, f32 scores [b, kv, g, t, s]. For comparison
  only."""
  import jax
  import jax.numpy as jnp

  b, t, h, x = q.shape
  kv, s = k.shape[1], k.shape[2]
  q_slot = vis.q_start + jnp.arange(t)
  mask = vis.k_valid[:, None, :] & (jnp.arange(s)[None, None, :] <= q_slot[None, :, None])
  if vis.segments is not None:
    seg = vis.segments
    mask &= (seg[:, None, :] == 0) | (seg[:, :, None] == seg[:, None, :])
  qg = q.reshape(b, t, kv, h // kv, x)
  scores = jnp.einsum("btkgx,bksx->bkgts", qg, k, preferred_element_type=jnp.float32) * x ** -0.5
  probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, -1e30), axis=-1)
  out = jnp.einsum("bkgts,bksx->btkgx", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(b, t, h, x).astype(v.dtype)


@contextlib.contextmanager
def dense_model_attention():
  """`llm.forward` with `dense_attention` in every layer while inside."""
  import jax

  from morse_jax.llm import model as model_lib

  real = model_lib._attention
  model_lib._attention = lambda q, k, v, vis, config: dense_attention(q, k, v, vis).reshape(
      q.shape[0], q.shape[1], config.q_size)
  jax.clear_caches()
  try:
    yield
  finally:
    model_lib._attention = real
    jax.clear_caches()


def measure(fn, args, repeats: int) -> dict:
  """temp MiB of the compiled fn and median seconds of its runs (one untimed run first, unless
  repeats is 1: the long rows time their one run, compiled beforehand)."""
  import jax

  compiled = jax.jit(fn).lower(*args).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  run = lambda: jax.block_until_ready(compiled(*args))
  if repeats > 1:
    run()
  return {"temp_mib": round(temp / MIB, 1), "seconds": round(median_seconds(run, repeats), 3)}


def op_programs(t: int, attend):
  import jax
  import jax.numpy as jnp

  from morse_jax.llm import attention

  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (1, t, 4, 64), jnp.float32)
  k, v = (jax.random.normal(key, (1, 4, t, 64), jnp.float32) for key in keys[1:])
  vis = attention.Visibility(0, jnp.ones((1, t), bool))
  fwd = lambda q, k, v: attend(q, k, v, vis)
  grad = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v, vis) ** 2), argnums=(0, 1, 2))
  return {"forward": (fwd, (q, k, v)), "grad": (grad, (q, k, v))}


def model_programs(t: int, path: str):
  """The model's forward pass, and the gradient of the update's own next-token log-probs
  (`rl.logprobs.token_logprobs`, remat): ours with the logits a chunk of tokens at a time, the
  dense path (before) with all of them at once."""
  import jax
  import jax.numpy as jnp

  from morse_jax import llm
  from morse_jax.rl import logprobs

  config = llm.LlmConfig(**SMALL, max_position_embeddings=max(t, 8192))
  params = llm.init_random(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (1, t), 0, config.vocab_size)
  chunk = logprobs.LOGIT_CHUNK if path == "ours" else t

  def forward(params, tokens):
    return llm.forward(params, config, tokens)[0]

  def loss(params, tokens):
    logp, _ = logprobs.token_logprobs(params, config, None, tokens, None, remat=True,
                                      chunk=chunk)
    return -jnp.mean(logp[:, 1:])

  return {"forward": (forward, (params, tokens)),
          "grad": (jax.grad(loss), (params, tokens))}


def main(argv):
  del argv
  from morse_jax.llm import attention_kernels

  rows = []
  for t in (int(n) for n in _LENGTHS.value):
    for path in ("ours", "dense"):
      if path == "dense" and t > _DENSE_MAX.value:
        rows.append({"length": t, "path": path, "skipped": f"the dense scores do not fit: "
                     f"{4 * 4 * t * t / 2**30:.0f} GiB per [4, t, t] float32 tensor"})
        print(rows[-1])
        continue
      for part in _PARTS.value:
        if part == "op":
          programs = op_programs(t, attention_kernels.attend if path == "ours" else dense_attention)
          scope = contextlib.nullcontext()
        else:
          programs = model_programs(t, path)
          scope = dense_model_attention() if path == "dense" else contextlib.nullcontext()
        with scope:
          for name, (fn, args) in programs.items():
            row = {"length": t, "path": path, "part": part, "program": name,
                   **measure(fn, args, 1 if t > 8192 else _REPEATS.value)}
            rows.append(row)
            print(row, flush=True)
  write_report("attention", _OUT.value, small_model=SMALL, rows=rows)


if __name__ == "__main__":
  app.run(main)
