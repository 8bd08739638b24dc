"""Train the toy backbone for CPU demos: a small Qwen3 taught the agents' turns on synthetic tasks.

  python -m launchers.pretrain_toy                                   # -> assets/toy_qwen3
  python -m launchers.pretrain_toy --steps=30 --problems=200 --out=/tmp/toy_try   # a quick look
  python -m launchers.pretrain_toy --init=assets/toy_qwen3 --categories=string_analysis \
      --steps=40 --out=/tmp/toy_dosed      # continue: a small dose of one category's executor turns

Generates synthetic problems of the train categories only (the held-out categories stay unseen,
so out-of-distribution evaluations remain honest), builds the planner / merger / executor turns
from their gold data, trains a byte-level BPE on them, trains the model from scratch, and saves a
Hugging Face folder that `llm.load` and transformers both read. The held-out loss is measured on
fresh problems (another seed) of the same categories.

With --init, training continues from an existing folder (its weights and tokenizer; no new BPE)
on the executor turns of the subtasks of --categories, mixed with --replay times as many turns of
the other categories (without them the model forgets what it could do): a short run teaches those
subtask types partly, which is how the committed toy gets a category it solves only sometimes.

--corpus=apex adds APEx's executor / planner / distiller conversations from synthetic worlds
(apex_jax.toy, compact prompts; --worlds worlds of seeds seed*1000 + i, held-out loss on world
seed 100000 + seed); with --init they are mixed with --replay times as many MoRSE turns of all
train categories, so one backbone keeps both. --corpus=both trains on the MoRSE and the APEx
corpus together (from scratch: a BPE over both). Multi-turn conversations train every reply and
no prompt or tool output (apex_jax.toy.encode):

  python -m launchers.pretrain_toy --corpus=apex --init=assets/toy_qwen3 --replay=0.5 \
      --steps=120 --lr=5e-4 --warmup=5 --out=/tmp/toy_apex_try
  python -m launchers.pretrain_toy --corpus=both --steps=3000 --problems=3000 --batch=16 \
      --out=/tmp/toy_apex_fresh        # a fresh toy with its own BPE (a GPU job)
"""

from __future__ import annotations

import dataclasses
import random
import time

from absl import app, flags

_STEPS = flags.DEFINE_integer("steps", 2000, "Optimizer steps.")
_PROBLEMS = flags.DEFINE_integer("problems", 2000, "Synthetic training problems.")
_HELDOUT = flags.DEFINE_integer("heldout_problems", 50, "Fresh problems for the held-out loss.")
_OUT = flags.DEFINE_string("out", "assets/toy_qwen3", "Output Hugging Face folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the problems, the init and the batch order.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows per step.")
_LR = flags.DEFINE_float("lr", 1e-3, "Peak learning rate.")
_VOCAB = flags.DEFINE_integer("vocab", 4096, "BPE vocabulary budget.")
_LOG_EVERY = flags.DEFINE_integer("log_every", 10, "Print progress every this many steps.")
_EVAL_EXAMPLES = flags.DEFINE_integer("eval_examples", 256, "Examples per final loss estimate.")
_INIT = flags.DEFINE_string("init", "", "Continue from this Hugging Face folder (weights and "
                            "tokenizer) instead of training from scratch.")
_CATEGORIES = flags.DEFINE_list("categories", [], "With --init: train on the executor turns of "
                                "these categories' subtasks only.")
_REPLAY = flags.DEFINE_float("replay", 1.0, "With --init: replayed turns of the other categories "
                             "per taught turn, so the skills the model has are not forgotten.")
_WARMUP = flags.DEFINE_integer("warmup", -1, "Warmup steps (default min(50, steps / 10)).")
_CORPUS = flags.DEFINE_enum("corpus", "morse", ["morse", "apex", "both"], "Training turns: "
                            "MoRSE's, APEx's (synthetic worlds) or both.")
_WORLDS = flags.DEFINE_integer("worlds", 4, "With --corpus=apex|both: synthetic worlds.")
_WORLD_ENTITIES = flags.DEFINE_integer("world_entities", 120, "Entities per world.")
_WORLD_QUESTIONS = flags.DEFINE_integer("world_questions", 400, "Questions per world.")
_BUCKETS = flags.DEFINE_list("buckets", ["512", "1024"], "Row lengths (one compiled shape each); "
                            "the largest is the longest example kept.")
_APEX_TOPK = flags.DEFINE_integer("apex_topk", 3, "Passages per search in the APEx turns "
                                  "(AgentConfig.topk at run time must match).")
_APEX_JUDGE_SHARE = flags.DEFINE_float("apex_judge_share", 0.0, "Share of APEx runs judged by one "
                                       "TTRL evaluator and the arbiter (apex_jax.toy.judging).")
_APEX_ALIGN_SHARE = flags.DEFINE_float("apex_align_share", 0.0, "Share of APEx questions whose "
                                       "plan the skill-alignment judge scores.")
_APEX_DISTILL_BATCHES = flags.DEFINE_integer("apex_distill_batches", 2, "Distiller prompts per "
                                             "category and world (a synthesis, then refines).")
_APEX_READING_HOPS = flags.DEFINE_integer("apex_reading_hops", 0, "Hops per APEx reading drill "
                                          "(apex_jax.toy.reading; 0: no drills).")
_APEX_SPACED_COPIES = flags.DEFINE_bool("apex_spaced_copies", False, "The executor's search "
                                        "queries and answers written after a space, so their "
                                        "BPE pieces equal the question's and passages' "
                                        "(apex_jax.toy.corpus.copied).")
_APEX_OTHER_SHARE = flags.DEFINE_float("apex_other_share", 1.0, "Share of the APEx planner, "
                                       "distiller and judge conversations kept (the executor's "
                                       "and the reading drills are all kept).")


def dose_turns(n: int, seed: int, categories) -> list[dict]:
  """Executor turns of the `categories` subtasks, from the problems of n that contain one."""
  from morse_jax.tasks import synthetic
  from morse_jax.toy import corpus

  problems = synthetic.split(synthetic.generate(n, seed), "test", holdout=tuple(categories))
  return corpus.executor_turns(problems, categories)


def apex_turns(seeds, topk: int) -> list[dict]:
  from apex_jax.agents.config import AgentConfig
  from apex_jax.toy import build
  from apex_jax.toy.corpus import CorpusConfig

  corpus_config = CorpusConfig(judge_share=_APEX_JUDGE_SHARE.value,
                               align_share=_APEX_ALIGN_SHARE.value,
                               distill_batches=_APEX_DISTILL_BATCHES.value,
                               reading_hops=_APEX_READING_HOPS.value,
                               spaced_copies=_APEX_SPACED_COPIES.value)
  turns, stats = build.corpus(seeds, _WORLD_ENTITIES.value, _WORLD_QUESTIONS.value,
                              AgentConfig(prompts="compact", topk=topk), corpus_config)
  if _APEX_OTHER_SHARE.value < 1:
    rng, kept = random.Random(seeds[0]), ("apex_execute", "apex_read")
    turns = [t for t in turns if t["role"] in kept or rng.random() < _APEX_OTHER_SHARE.value]
    stats["other_share"] = _APEX_OTHER_SHARE.value
  print(f"apex corpus (worlds {list(seeds)}): {dict(sorted(stats.items()))}", flush=True)
  return turns


def main(argv):
  del argv
  import jax
  import numpy as np

  from morse_jax.tasks import synthetic
  from morse_jax.toy import corpus, sft, tokenizer

  heads = max(1, _HIDDEN.value // 64)
  try:
    buckets = tuple(sorted(int(b) for b in _BUCKETS.value))
  except ValueError:
    raise app.UsageError(f"--buckets must be integers, got {_BUCKETS.value}") from None
  if not buckets or buckets[0] < 8:
    raise app.UsageError(f"--buckets must be row lengths >= 8, got {_BUCKETS.value}")
  cfg = sft.ToyConfig(vocab_size=_VOCAB.value, hidden=_HIDDEN.value, layers=_LAYERS.value,
                      heads=heads, kv_heads=max(1, heads // 2), intermediate=3 * _HIDDEN.value,
                      max_len=max(buckets), buckets=buckets,
                      batch=_BATCH.value, lr=_LR.value, steps=_STEPS.value, seed=_SEED.value,
                      warmup=_WARMUP.value if _WARMUP.value >= 0
                      else min(50, max(1, _STEPS.value // 10)))
  start = time.time()
  apex = _CORPUS.value != "morse"
  if apex:
    from apex_jax.toy import encode

    world_seeds = [_SEED.value * 1000 + i for i in range(_WORLDS.value)]
    train_turns = apex_turns(world_seeds, _APEX_TOPK.value)
    held_turns = apex_turns([100000 + _SEED.value], _APEX_TOPK.value)
    if _CORPUS.value == "both":
      categories = synthetic.train_categories()
      train_turns += corpus.turns(synthetic.generate(_PROBLEMS.value, _SEED.value, categories))
    elif _INIT.value and _REPLAY.value > 0:
      replay = corpus.turns(synthetic.generate(_PROBLEMS.value, _SEED.value + 2,
                                               synthetic.train_categories()))
      keep = np.random.default_rng(_SEED.value).permutation(len(replay))
      train_turns += [replay[i] for i in keep[:int(_REPLAY.value * len(train_turns))]]
    if _INIT.value:
      from morse_jax import llm

      init = llm.load(_INIT.value)
      hf_tok, config, params = init.tokenizer.hf, init.config, init.params
    else:
      hf_tok = tokenizer.train_bpe(encode.texts(train_turns), cfg.vocab_size)
      config = sft.llm_config(cfg, len(hf_tok))
      params = sft.init_params(config, cfg.seed)
  elif _INIT.value:
    if not _CATEGORIES.value:
      raise app.UsageError("--init needs --categories (the subtask types to teach)")
    from morse_jax import llm

    init = llm.load(_INIT.value)
    hf_tok, config, params = init.tokenizer.hf, init.config, init.params
    train_turns = dose_turns(_PROBLEMS.value, _SEED.value, _CATEGORIES.value)
    others = synthetic.train_categories(tuple(_CATEGORIES.value))
    replay = corpus.turns(synthetic.generate(_PROBLEMS.value, _SEED.value + 2, others))
    keep = np.random.default_rng(_SEED.value).permutation(len(replay))
    train_turns += [replay[i] for i in keep[:int(_REPLAY.value * len(train_turns))]]
    held_turns = dose_turns(_HELDOUT.value, _SEED.value + 1, _CATEGORIES.value)
  else:
    categories = synthetic.train_categories()
    train_turns = corpus.turns(synthetic.generate(_PROBLEMS.value, _SEED.value, categories))
    held_turns = corpus.turns(synthetic.generate(_HELDOUT.value, _SEED.value + 1, categories))
    hf_tok = tokenizer.train_bpe(corpus.texts(train_turns), cfg.vocab_size)
    config = sft.llm_config(cfg, len(hf_tok))
    params = sft.init_params(config, cfg.seed)
  if apex:  # multi-turn: every reply trained; a long conversation is cut after a whole reply
    train_data, dropped, cut = encode.examples(train_turns, hf_tok, cfg.max_len)
    held_data, _, _ = encode.examples(held_turns, hf_tok, cfg.max_len)
  else:
    (train_data, dropped), cut = sft.examples(train_turns, hf_tok, cfg.max_len), 0
    held_data, _ = sft.examples(held_turns, hf_tok, cfg.max_len)
  targets = sum(int(m.sum()) for _, m in train_data)
  cut_note = f", {cut} cut after their last whole reply" if apex else ""
  print(f"corpus: {len(train_turns)} turns ({dropped} longer than {cfg.max_len} dropped"
        f"{cut_note}), "
        f"{sum(len(t) for t, _ in train_data)} tokens, {targets} target tokens; "
        f"vocab {len(hf_tok)} -> {config.vocab_size}; {config.num_params() / 1e6:.2f}M params; "
        f"{dataclasses.asdict(cfg)}; setup {time.time() - start:.1f}s", flush=True)

  opt = sft.optimizer(cfg)
  opt_state = opt.init(params)
  train_step = sft.make_train_step(config, opt)
  stream = sft.batches(train_data, cfg.buckets, cfg.batch, hf_tok.pad_token_id, cfg.seed)
  t0, tokens_seen, window = time.time(), 0, []
  for step in range(1, cfg.steps + 1):
    batch = next(stream)
    params, opt_state, metrics = train_step(params, opt_state, batch)
    tokens_seen += int(batch["attention_mask"].sum())
    window.append(metrics)
    if step % _LOG_EVERY.value == 0 or step == cfg.steps:
      window = jax.device_get(window)
      elapsed = time.time() - t0
      print(f"step {step}: loss {np.mean([m['loss'] for m in window]):.4f} "
            f"grad_norm {np.mean([m['grad_norm'] for m in window]):.3f} | "
            f"{step / elapsed:.2f} steps/s {tokens_seen / elapsed:.0f} tokens/s "
            f"(first step includes compiles)", flush=True)
      window = []
  train_time = time.time() - t0

  sft.save(_OUT.value, config, params, hf_tok)
  n = _EVAL_EXAMPLES.value
  train_loss = sft.evaluate_loss(params, config, train_data[:n], cfg.buckets, cfg.batch,
                                 hf_tok.pad_token_id)
  held_loss = sft.evaluate_loss(params, config, held_data[:n], cfg.buckets, cfg.batch,
                                hf_tok.pad_token_id)
  print(f"saved {_OUT.value}; training {train_time:.1f}s; final loss: train {train_loss:.4f} "
        f"held-out {held_loss:.4f} (per target token, {n} examples each)", flush=True)


if __name__ == "__main__":
  app.run(main)
