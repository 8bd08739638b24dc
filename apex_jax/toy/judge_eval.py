"""The toy as the demo's own TTRL judges, measured on runs and plans of a world's judge corpus
(`toy.evaluate --judge_runs`; the corpus is `toy.judging`'s)."""

from __future__ import annotations

import collections

from apex_jax.agents import AgentConfig
from apex_jax.datasets.world import World
from apex_jax.judges import InProcessChat
from apex_jax.toy import build, corpus as C
from apex_jax.training.judging import judge_panel


def judge_metrics(model, world_seed: int, questions: int, topk: int, runs: int,
                  max_tokens: int = 32) -> dict:
  """The toy as the demo's TTRL judges (`training.judging.judge_panel` over InProcessChat,
  `max_tokens` replies) on the first `runs` judged runs and plans of a world's corpus: failure
  counts, the arbiter's verdicts against each run's kind and its accuracy, the mean evaluator
  score per kind, and the share of alignment scores equal to the corpus's label."""
  world = World.generate(world_seed, 120, questions)
  turns, _ = build.world_turns(world, AgentConfig(prompts="compact", topk=topk),
                               C.CorpusConfig(judge_share=1.0, align_share=1.0))
  panel = judge_panel(InProcessChat(model, seed=0), max_tokens)
  arbiters = [t for t in turns if t.get("judge") == "arbiter"][:runs]
  judged = panel.nogt.judge_many([(t["question"], t["candidate"]) for t in arbiters])
  labels = ["gold" if t["kind"] is None else "corrupted" for t in arbiters]
  verdicts = collections.Counter(f"{label}->{j.verdict}" for label, j in zip(labels, judged))
  scores = collections.defaultdict(list)
  for label, j in zip(labels, judged):
    for name, e in j.evaluators.items():
      if e.failure is None:
        scores[f"{name}/{label}"].append(e.score)
  plans = [t for t in turns if t.get("judge") == "alignment"][:runs]
  got = panel.align.score_many([(t["plan"], t["skill"]) for t in plans])
  return {"runs": len(arbiters), "gold_runs": labels.count("gold"),
          "evaluator_failures": panel.nogt.evaluator_failures.snapshot(),
          "arbiter_failures": panel.nogt.arbiter_failures.snapshot(),
          "arbiter_verdicts": dict(verdicts),
          "arbiter_accuracy": (verdicts["gold->correct"] + verdicts["corrupted->incorrect"])
                              / max(len(arbiters), 1),
          "evaluator_mean_score": {k: sum(v) / len(v) for k, v in sorted(scores.items())},
          "alignment_plans": len(plans), "alignment_failures": panel.align.failures.snapshot(),
          "alignment_label_match": sum(a.failure is None and a.score == t["score"]
                                       for a, t in zip(got, plans)) / max(len(plans), 1)}
