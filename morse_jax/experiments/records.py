"""Evaluation records: one JSON line per node and one per problem, so that a run says why each
node failed (the reply, the code the verifier took from it, the verifier's reason, whether the
token limit cut the reply) and what each call cost, not only the summary's rates.

  node     problem_id, node_id, title, wave, route (0-based subtask experts), prompt_tokens
           (executor prompt, chat template included), context_tokens (what the merger or the
           parent handed over), generated_tokens (stop token included), cut (ended by the token
           limit), reward, passed, reason (the verifier's; None when passed), reply, code (what
           the verifier took; None: none found), details (the family's other details),
           merge_seconds / wave_seconds (the wave's merge and executor sampler calls, shared by
           the wave's nodes; on the engine (eval.engine) the node's own calls, submission to
           reply; a new shape's first call includes compiling), score_seconds (this
           node's verifier), prompt (only on request)
  problem  problem_id, passed, steps_passed, steps, metrics (the family's)
Fields `run` did not measure (outcomes of `runner.train`) are null."""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

from morse_jax.execution import verifier
from morse_jax.mas.runner import TaskOutcome


def node_record(task: TaskOutcome, node_id: str, prompts: bool = False) -> dict[str, Any]:
  node, outcome = task.graph.node(node_id), task.nodes[node_id]
  details = dict(outcome.score.details)
  # Families that extract code themselves say which code they took (HumanEval); the others
  # take it with the shared rule.
  code = details.pop("code") if "code" in details else verifier.extract_code(outcome.artifact)
  reason = details.pop("reason", None)
  if reason is None and not outcome.score.passed:
    reason = "the verifier gave no reason"
  stats = outcome.stats
  record = {
      "kind": "node", "problem_id": task.problem.id, "node_id": node_id, "title": node.title,
      "wave": stats and stats.wave, "route": list(outcome.subtask_experts),
      "prompt_tokens": stats and stats.prompt_tokens,
      "context_tokens": stats and stats.context_tokens,
      "generated_tokens": stats and stats.generated_tokens, "cut": stats and stats.cut,
      "reward": float(outcome.score.reward), "passed": bool(outcome.score.passed),
      "reason": reason, "reply": outcome.artifact, "code": code, "details": details,
      "merge_seconds": stats and stats.merge_seconds,
      "wave_seconds": stats and stats.wave_seconds,
      "score_seconds": stats and stats.score_seconds,
  }
  if prompts:
    record["prompt"] = stats and stats.prompt
  return record


def problem_record(task: TaskOutcome) -> dict[str, Any]:
  passed = [task.nodes[i].score.passed for i in task.graph.topological_order()]
  score = task.score
  return {"kind": "problem", "problem_id": task.problem.id,
          "passed": bool(score and score.passed), "steps_passed": int(sum(passed)),
          "steps": len(passed), "metrics": dict(score.metrics) if score else {}}


def records(outcomes: Sequence[TaskOutcome], prompts: bool = False) -> Iterator[dict[str, Any]]:
  """Per task: its nodes in topological order, then its problem line."""
  for task in outcomes:
    for node_id in task.graph.topological_order():
      yield node_record(task, node_id, prompts)
    yield problem_record(task)


def write(path: str, outcomes: Sequence[TaskOutcome], prompts: bool = False) -> int:
  """Writes the records as JSONL (details that JSON cannot hold as str); returns the count."""
  n = 0
  with open(path, "w") as f:
    for record in records(outcomes, prompts):
      f.write(json.dumps(record, default=str) + "\n")
      n += 1
  return n
