"""One evaluation row's numbers, whichever system ran it (APEx's ablation rows in
`apex_jax.pipeline`, the comparison systems in `apex_jax.baselines`): EM / F1 overall, per
category and per hop count, the answered share and the context tokens per episode."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from apex_jax.datasets import evaluate as score_predictions
from apex_jax.memory import CATEGORIES, MODALITIES, Bucket


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one question's episode left for its row."""
  answer: str | None  # the final answer; None: the run ended without one
  context_tokens: int  # every conversation it ran: prompts, generations and tool output
  memory_tokens: int  # the memory text its prompts carried (APEx: the planner context E(q))


def batches(items, size: int) -> list:
  return [items[i:i + size] for i in range(0, len(items), size)]


def row_scores(examples: Sequence, outcomes: Sequence[Outcome]) -> dict:
  """`datasets.evaluate` of the answers (a missing one scores as ""), with `answered`,
  `context_tokens` and `memory_context_tokens` (means over the episodes)."""
  if len(outcomes) != len(examples):
    raise ValueError(f"row_scores: {len(outcomes)} outcomes for {len(examples)} examples")
  scores = score_predictions({ex.id: o.answer or "" for ex, o in zip(examples, outcomes)},
                             examples)
  n = max(len(outcomes), 1)
  scores["answered"] = sum(o.answer is not None for o in outcomes) / n
  scores["context_tokens"] = sum(o.context_tokens for o in outcomes) / n
  scores["memory_context_tokens"] = sum(o.memory_tokens for o in outcomes) / n
  return scores


def eval_examples(exp, split: str = "test") -> list:
  """`split`'s first `eval.questions` questions (0: all): every row's."""
  if split not in ("train", "test"):
    raise ValueError(f"split {split!r} not in ('train', 'test')")
  examples = exp.train if split == "train" else exp.test
  n = exp.config.eval.questions
  return examples[:n] if n else examples


def bank_counts(bank) -> dict:
  """Memories and skill documents a bank holds (the rows' banks, in the results)."""
  return {"memories": len(bank), "skills": sum(
      bank.get_skill(Bucket(cat, mod)) is not None for cat in CATEGORIES for mod in MODALITIES)}
