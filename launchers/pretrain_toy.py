"""Train the toy backbone for CPU demos: a small Qwen3 taught the agents' turns on synthetic tasks.

  python -m launchers.pretrain_toy --config=configs/toy/qwen3.py      # -> assets/toy_qwen3
  python -m launchers.pretrain_toy --config=configs/toy/qwen3.py --config.toy.steps=30 \
      --config.data.problems=200 --config.out=/tmp/toy_try          # a quick look
  python -m launchers.pretrain_toy --config=configs/toy/qwen3_dose.py  # continue: a small dose
                                                                        # of one category's turns
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:1     # the APEx toy, run 1 of 4

Every setting is in the config (configs/toy/common.py: `toy` is every `sft.ToyConfig` field,
`corpus` every `apex_jax.toy.CorpusConfig` field, `data` the turns' sources).

Generates synthetic problems of the train categories only (the held-out categories stay unseen,
so out-of-distribution evaluations remain honest), builds the planner / merger / executor turns
from their gold data, trains a byte-level BPE on them, trains the model from scratch, and saves a
Hugging Face folder that `llm.load` and transformers both read. The held-out loss is measured on
fresh problems (another seed) of the same categories.

With `init`, training continues from an existing folder (its weights and tokenizer; no new BPE)
on the executor turns of the subtasks of `data.categories`, mixed with `data.replay` times as
many turns of the other categories (without them the model forgets what it could do): a short run
teaches those subtask types partly, which is how the committed toy gets a category it solves only
sometimes.

`data.corpus=apex` adds APEx's executor / planner / distiller conversations from synthetic worlds
(apex_jax.toy, compact prompts; `data.worlds` worlds of seeds seed*1000 + i, held-out loss on
world seed 100000 + seed); with `init` they are mixed with `data.replay` times as many MoRSE
turns of all train categories, so one backbone keeps both. `both` trains on the MoRSE and the
APEx corpus together (from scratch: a BPE over both). Multi-turn conversations train every reply
and no prompt or tool output (apex_jax.toy.encode).
"""

from __future__ import annotations

import dataclasses
import random
import time

from absl import app
from ml_collections import config_flags

from morse_jax.config_sections import check, settings

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/toy/<run>.py", lock_config=True)
CORPORA = ("morse", "apex", "both")


def dose_turns(n: int, seed: int, categories) -> list[dict]:
  """Executor turns of the `categories` subtasks, from the problems of n that contain one."""
  from morse_jax.tasks import synthetic
  from morse_jax.toy import corpus

  problems = synthetic.split(synthetic.generate(n, seed), "test", holdout=tuple(categories))
  return corpus.executor_turns(problems, categories)


def apex_turns(seeds, data, corpus_config) -> list[dict]:
  from apex_jax.agents.config import AgentConfig
  from apex_jax.toy import build

  turns, stats = build.corpus(seeds, data.world_entities, data.world_questions,
                              AgentConfig(prompts="compact", topk=data.apex_topk), corpus_config,
                              procedures=bool(data.get("world_procedures", False)))
  if data.apex_other_share < 1:
    rng, kept = random.Random(seeds[0]), ("apex_execute", "apex_read")
    turns = [t for t in turns if t["role"] in kept or rng.random() < data.apex_other_share]
    stats["other_share"] = data.apex_other_share
  print(f"apex corpus (worlds {list(seeds)}): {dict(sorted(stats.items()))}", flush=True)
  return turns


def main(argv):
  del argv
  import jax
  import numpy as np

  from morse_jax.tasks import synthetic
  from morse_jax.toy import corpus, sft, tokenizer

  from apex_jax.toy.corpus import CorpusConfig

  c = _CONFIG.value
  if c is None:
    raise app.UsageError("give --config=configs/toy/<run>.py (e.g. configs/toy/qwen3.py)")
  cfg = settings(sft.ToyConfig, c.toy, "toy")
  corpus_config = settings(CorpusConfig, c.corpus, "corpus")
  data, seed, init_path = c.data, cfg.seed, c.init
  check(data.corpus in CORPORA, "data.corpus", data.corpus, f"not one of {CORPORA}")
  check(0 <= data.apex_other_share <= 1, "data.apex_other_share", data.apex_other_share,
        "not in [0, 1]")
  check(bool(cfg.buckets) and min(cfg.buckets) >= 8, "toy.buckets", cfg.buckets,
        "row lengths >= 8")
  check(cfg.max_len == max(cfg.buckets), "toy.max_len", cfg.max_len,
        f"must be the largest bucket ({max(cfg.buckets)})")
  start = time.time()
  apex = data.corpus != "morse"
  if apex:
    from apex_jax.toy import encode

    from apex_jax.toy.build import world_seeds

    train_seeds, held_seeds = world_seeds(seed, data.worlds)
    train_turns = apex_turns(train_seeds, data, corpus_config)
    held_turns = apex_turns(held_seeds, data, corpus_config)
    if data.corpus == "both":
      categories = synthetic.train_categories()
      train_turns += corpus.turns(synthetic.generate(data.problems, seed, categories))
    elif init_path and data.replay > 0:
      replay = corpus.turns(synthetic.generate(data.problems, seed + 2,
                                               synthetic.train_categories()))
      keep = np.random.default_rng(seed).permutation(len(replay))
      train_turns += [replay[i] for i in keep[:int(data.replay * len(train_turns))]]
    if init_path:
      from morse_jax import llm

      init = llm.load(init_path)
      hf_tok, config, params = init.tokenizer.hf, init.config, init.params
    else:
      hf_tok = tokenizer.train_bpe(encode.texts(train_turns), cfg.vocab_size)
      config = sft.llm_config(cfg, len(hf_tok))
      params = sft.init_params(config, cfg.seed)
  elif init_path:
    check(bool(data.categories), "data.categories", data.categories,
          "init needs the subtask types to teach")
    from morse_jax import llm

    init = llm.load(init_path)
    hf_tok, config, params = init.tokenizer.hf, init.config, init.params
    train_turns = dose_turns(data.problems, seed, data.categories)
    others = synthetic.train_categories(tuple(data.categories))
    replay = corpus.turns(synthetic.generate(data.problems, seed + 2, others))
    keep = np.random.default_rng(seed).permutation(len(replay))
    train_turns += [replay[i] for i in keep[:int(data.replay * len(train_turns))]]
    held_turns = dose_turns(data.heldout_problems, seed + 1, data.categories)
  else:
    categories = synthetic.train_categories()
    train_turns = corpus.turns(synthetic.generate(data.problems, seed, categories))
    held_turns = corpus.turns(synthetic.generate(data.heldout_problems, seed + 1, categories))
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
    if step % c.log_every == 0 or step == cfg.steps:
      window = jax.device_get(window)
      elapsed = time.time() - t0
      print(f"step {step}: loss {np.mean([m['loss'] for m in window]):.4f} "
            f"grad_norm {np.mean([m['grad_norm'] for m in window]):.3f} | "
            f"{step / elapsed:.2f} steps/s {tokens_seen / elapsed:.0f} tokens/s "
            f"(first step includes compiles)", flush=True)
      window = []
  train_time = time.time() - t0

  sft.save(c.out, config, params, hf_tok)
  n = c.eval_examples
  train_loss = sft.evaluate_loss(params, config, train_data[:n], cfg.buckets, cfg.batch,
                                 hf_tok.pad_token_id)
  held_loss = sft.evaluate_loss(params, config, held_data[:n], cfg.buckets, cfg.batch,
                                hf_tok.pad_token_id)
  print(f"saved {c.out}; training {train_time:.1f}s; final loss: train {train_loss:.4f} "
        f"held-out {held_loss:.4f} (per target token, {n} examples each)", flush=True)


if __name__ == "__main__":
  app.run(main)
