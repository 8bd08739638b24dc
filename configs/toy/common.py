"""Shared settings of the toy-backbone configs (`launchers.pretrain_toy --config=...`).

  toy         sft.ToyConfig: the model's shape and the optimiser (every field)
  corpus      apex_jax.toy.CorpusConfig: the APEx conversations' mix (every field)
  data        which turns: corpus "morse" / "apex" / "both", problems, worlds, the dose's
              categories and replay
  out, init   the Hugging Face folder written; one to continue from ("": train from scratch)
"""

from __future__ import annotations

import ml_collections

from apex_jax.toy.corpus import CorpusConfig
from morse_jax.config_sections import section
from morse_jax.toy.sft import ToyConfig


def toy(hidden: int = 256, buckets=(512, 1024), steps: int = 2000, warmup: int | None = None,
        **values) -> ToyConfig:
  """The launcher's derived shape: hidden / 64 heads, half as many KV heads, a 3x MLP, the
  longest bucket as max_len, warmup min(50, steps / 10) unless given."""
  heads = max(1, hidden // 64)
  buckets = tuple(sorted(buckets))
  return ToyConfig(hidden=hidden, heads=heads, kv_heads=max(1, heads // 2),
                   intermediate=3 * hidden, max_len=max(buckets), buckets=buckets, steps=steps,
                   warmup=min(50, max(1, steps // 10)) if warmup is None else warmup, **values)


def base(out: str = "assets/toy_qwen3", **toy_values) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.out = out
  c.init = ""  # continue from this folder (its weights and tokenizer; no new BPE)
  c.toy = section(toy(**toy_values))
  c.corpus = section(CorpusConfig())
  c.data = ml_collections.ConfigDict(dict(
      corpus="morse",  # "morse", "apex" (synthetic worlds) or "both"
      problems=2000,  # synthetic training problems
      heldout_problems=50,  # fresh problems for the held-out loss
      categories=(),  # with init: train on the executor turns of these categories' subtasks
      replay=1.0,  # with init: replayed turns of the other categories per taught turn
      worlds=4, world_entities=120, world_questions=400,  # corpus apex / both
      world_procedures=False,  # the worlds' career / property facts in records (world_records)
      apex_topk=3,  # passages per search in the APEx turns (AgentConfig.topk must match)
      # share of the APEx planner, distiller and judge conversations kept (the executor's and
      # the reading drills are all kept)
      apex_other_share=1.0))
  c.log_every = 10
  c.eval_examples = 256  # examples per final loss estimate
  return c
