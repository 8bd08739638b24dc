"""Supervised training of a small Qwen3-architecture model from scratch on the toy corpus.

One example is one chat turn: the prompt rendered by the tokenizer's chat template with the
generation prompt, then the target and <|im_end|>. The loss covers the target tokens and the
closing <|im_end|> only, so the model learns to answer and to stop, never to write prompts.

Rows are right-padded to a fixed length bucket, one turn per row. Turns are not packed together:
`llm.forward` has no per-segment attention mask, and a packed turn would see the turns before it,
which a prompt at inference never does. Each bucket length is one compiled shape.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from morse_jax import llm
from morse_jax.toy import tokenizer as toy_tokenizer


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  vocab_size: int = 4096  # the BPE's budget; the model's vocab is the trained size rounded up
  hidden: int = 256
  layers: int = 4
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 64
  intermediate: int = 768
  max_len: int = 1024  # longest turn kept; also the largest bucket
  buckets: tuple[int, ...] = (512, 1024)  # row lengths; a turn goes to the smallest that fits
  batch: int = 8
  lr: float = 1e-3
  warmup: int = 50
  steps: int = 1000
  weight_decay: float = 0.1
  clip: float = 1.0
  seed: int = 0
  rope_theta: float = 10000.0


def llm_config(cfg: ToyConfig, vocab: int) -> llm.LlmConfig:
  """Qwen3 (q/k norms), tied embeddings; vocab rounded up to 64 for aligned matmuls."""
  return llm.LlmConfig(
      model_type="qwen3", vocab_size=-(-vocab // 64) * 64, hidden_size=cfg.hidden,
      intermediate_size=cfg.intermediate, num_layers=cfg.layers, num_heads=cfg.heads,
      num_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, rope=llm.RopeConfig(theta=cfg.rope_theta),
      tie_word_embeddings=True, qk_norm=True, max_position_embeddings=max(cfg.max_len, 2048))


def init_params(config: llm.LlmConfig, seed: int) -> llm.Params:
  return llm.init_random(config, jax.random.key(seed), scale=0.02)


def _wrap(tok) -> llm.Tokenizer:
  return tok if isinstance(tok, llm.Tokenizer) else llm.Tokenizer(tok, "<toy tokenizer>")


def encode(turn: dict[str, Any], tok, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [n], loss_mask [n]) with n <= max_len; the mask is 1 on the target and the closing
  <|im_end|>. The target is encoded on its own, as the sampler meets it: after the prompt's
  trailing "assistant\\n", token by token. Longer turns are cut at max_len (see `examples`)."""
  tok = _wrap(tok)
  prompt = tok.apply_chat_template(turn["messages"], add_generation_prompt=True)
  target = tok.encode(turn["target"]) + [tok.hf.convert_tokens_to_ids(toy_tokenizer.IM_END)]
  tokens = np.asarray(prompt + target, np.int32)[:max_len]
  mask = np.concatenate([np.zeros(len(prompt), np.float32), np.ones(len(target), np.float32)])
  return tokens, mask[:max_len]


def examples(turns: Sequence[dict[str, Any]], tok, max_len: int):
  """Encoded turns that fit in max_len whole, and how many were dropped for being longer."""
  out, dropped = [], 0
  for turn in turns:
    tokens, mask = encode(turn, tok, max_len + 1)
    if len(tokens) > max_len:
      dropped += 1
    else:
      out.append((tokens, mask))
  return out, dropped


def pad_batch(rows: Sequence[tuple[np.ndarray, np.ndarray]], length: int, batch: int,
              pad_id: int) -> dict[str, np.ndarray]:
  """Right-pads rows to [batch, length]; missing rows are all padding (mask 0, no loss)."""
  tokens = np.full((batch, length), pad_id, np.int32)
  loss_mask = np.zeros((batch, length), np.float32)
  attn = np.zeros((batch, length), bool)
  for i, (t, m) in enumerate(rows):
    tokens[i, :len(t)], loss_mask[i, :len(t)], attn[i, :len(t)] = t, m, True
  return {"tokens": tokens, "loss_mask": loss_mask, "attention_mask": attn}


def _bucket_of(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in sorted(buckets) if n <= b)


def batches(data, buckets: Sequence[int], batch: int, pad_id: int, seed: int,
            epochs: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Shuffled full batches, each from one bucket, epoch after epoch (forever by default). A
  bucket's last partial batch is padded with empty rows."""
  if not data:
    raise ValueError("batches: no examples (were they all longer than max_len?)")
  groups: dict[int, list] = {}
  for row in data:
    groups.setdefault(_bucket_of(len(row[0]), buckets), []).append(row)
  rng = np.random.default_rng(seed)
  epoch = 0
  while epochs is None or epoch < epochs:
    plan = []
    for length, rows in groups.items():
      order = rng.permutation(len(rows))
      plan += [(length, [rows[j] for j in order[i:i + batch]]) for i in range(0, len(rows), batch)]
    for k in rng.permutation(len(plan)):
      length, rows = plan[k]
      yield pad_batch(rows, length, batch, pad_id)
    epoch += 1


def optimizer(cfg: ToyConfig) -> optax.GradientTransformation:
  """AdamW with linear warmup then cosine decay to lr/10, global-norm clipping; no weight decay
  on norms (vectors)."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, max(1, cfg.warmup),
                                                max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.1)
  decay_mask = lambda params: jax.tree.map(lambda a: a.ndim >= 2, params)
  return optax.chain(optax.clip_by_global_norm(cfg.clip),
                     optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay,
                                 mask=decay_mask))


def loss_sums(params: llm.Params, config: llm.LlmConfig, batch) -> tuple[jax.Array, jax.Array]:
  """(summed next-token cross-entropy over loss-masked targets, number of such targets)."""
  logits, _ = llm.forward(params, config, batch["tokens"], attention_mask=batch["attention_mask"])
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], axis=-1)[..., 0]
  mask = batch["loss_mask"][:, 1:]
  return jnp.sum(nll * mask), jnp.sum(mask)


def make_train_step(config: llm.LlmConfig, opt: optax.GradientTransformation):
  """train_step(params, opt_state, batch) -> (params, opt_state, {loss, grad_norm, targets})."""

  def mean_loss(params, batch):
    total, count = loss_sums(params, config, batch)
    return total / jnp.maximum(count, 1.0), count

  @jax.jit
  def train_step(params, opt_state, batch):
    (loss, count), grads = jax.value_and_grad(mean_loss, has_aux=True)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                               "targets": count}

  return train_step


_loss_sums_jit = jax.jit(loss_sums, static_argnums=1)


def evaluate_loss(params: llm.Params, config: llm.LlmConfig, data, buckets: Sequence[int],
                  batch: int, pad_id: int) -> float:
  """Mean per-target-token loss over every example of `data` (one pass, no shuffling effect)."""
  total, count = 0.0, 0.0
  for b in batches(data, buckets, batch, pad_id, seed=0, epochs=1):
    t, c = _loss_sums_jit(params, config, b)
    total, count = total + float(t), count + float(c)
  return total / max(count, 1.0)


def save(path: str, config: llm.LlmConfig, params: llm.Params, hf_tok) -> None:
  """Hugging Face layout via `llm.save`: config.json, model.safetensors, tokenizer files and a
  generation_config.json whose eos ids make the sampler stop on <|im_end|>."""
  gen = toy_tokenizer.generation_config(hf_tok)
  hf_extra = {"eos_token_id": gen["eos_token_id"][0], "pad_token_id": gen["pad_token_id"],
              "bos_token_id": None}
  model = llm.Model(config=config, params=params, tokenizer=llm.Tokenizer(hf_tok, path),
                    hf_config=hf_extra, generation_config=gen)
  llm.save(model, os.path.abspath(path))
