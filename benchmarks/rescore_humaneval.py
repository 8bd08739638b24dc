"""Scores stored HumanEval replies again with the verifier of the checkout it runs in.

  python benchmarks/rescore_humaneval.py --records=RUN/eval_test.jsonl [--out=FILE.json]

Run from another checkout (`git worktree add /tmp/old <commit>; cd /tmp/old; python
/path/to/benchmarks/rescore_humaneval.py --records=...`) it tells what a change of the code
extraction did to the same replies: no generation, so the before / after difference is the
verifier's alone. Reads any JSONL with `problem_id` and `reply` per line (our evaluation
records, or benchmarks.humaneval_transformers' output).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the checkout we stand in, not the one this file is in

from absl import app, flags  # noqa: E402

_RECORDS = flags.DEFINE_string("records", None, "JSONL with problem_id and reply per line.")
_OUT = flags.DEFINE_string("out", None, "Write the summary as JSON.")


def main(argv):
  del argv
  import subprocess

  from morse_jax.tasks import humaneval

  family, problems = humaneval.HumanEval(), {p.id: p for p in humaneval.load()}
  passed, total = 0, 0
  with open(_RECORDS.value) as f:
    for line in f:
      rec = json.loads(line)
      if "reply" not in rec or rec.get("kind", "node") != "node":
        continue
      p = problems[rec["problem_id"]]
      passed += family.score_node(p, dict(p.gold_graph[0]), rec["reply"], {}).passed
      total += 1
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  summary = {"records": _RECORDS.value, "commit": commit, "replies": total, "passed": passed,
             "pass@1": passed / max(total, 1)}
  print(json.dumps(summary))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(summary, f, indent=2)


if __name__ == "__main__":
  app.run(main)
