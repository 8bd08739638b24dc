"""Why HumanEval replies fail: each failing record's cause, counted, read off the records.

  python -m benchmarks.humaneval_failures --records=RUN/eval_test.jsonl [--out=FILE.json]

Reads our evaluation records (eval_<split>.jsonl) or benchmarks.humaneval_transformers' JSONL
(`problem_id`, `reply`, `passed`, `reason`) and prints one line per failing problem and a count
per cause. A cause is decided from the record alone, first match wins:

  cut          the reply ended at max_new_tokens (records with `cut`)
  no_code      no code to test was found in the reply
  placeholder  a stub or TODO (the verifier's placeholder rule)
  syntax       the program does not compile
  timeout      the program or the tests ran out of time (wall clock, or the sandbox's CPU-time
               limit, which kills the program before it answers)
  strict       the harness's strict comparison refused a value (shape / kind / length)
  harness      the harness gave no summary (its own failure, or the program killed it)
  wrong_answer an assert of the problem's `check` failed
  error        the program raised while it was tested (any other exception)
"""

from __future__ import annotations

import collections
import json

from absl import app, flags

CAUSES = ("cut", "no_code", "placeholder", "syntax", "timeout", "strict", "harness",
          "wrong_answer", "error")


def cause(record: dict) -> str:
  """The cause of one failing record (see the module docstring)."""
  reason = record.get("reason") or ""
  if record.get("cut"):
    return "cut"
  if reason.startswith("no fenced code block") or reason.startswith("no code"):
    return "no_code"
  if "is a placeholder" in reason or reason.startswith("TODO "):
    return "placeholder"
  if reason.startswith("syntax error") or reason.startswith("code does not compile"):
    return "syntax"
  if ("timed out" in reason or "past its deadline" in reason or "TimeoutError" in reason
      or "killed before it answered" in reason):
    return "timeout"
  if "StrictComparisonError" in reason or "the verifier compares values of" in reason:
    return "strict"
  if "the harness gave no summary" in reason or reason.startswith("test run failed"):
    return "harness"
  if reason.endswith("AssertionError") or ": AssertionError" in reason:
    return "wrong_answer"
  return "error"


def failures(lines) -> list[dict]:
  """problem_id, cause and reason of every failing node record in JSONL lines."""
  out = []
  for line in lines:
    rec = json.loads(line)
    if rec.get("kind", "node") != "node" or "reply" not in rec or rec["passed"]:
      continue
    out.append({"problem_id": rec["problem_id"], "cause": cause(rec),
                "reason": (rec.get("reason") or "")[:200]})
  return out


def main(argv):
  del argv
  with open(_RECORDS.value) as f:
    found = failures(f)
  for rec in found:
    print(f"{rec['problem_id']:<14} {rec['cause']:<12} {rec['reason'][:110]}")
  counts = collections.Counter(r["cause"] for r in found)
  print(", ".join(f"{c} {counts[c]}" for c in CAUSES if counts[c]) or "no failures")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"records": _RECORDS.value, "failures": len(found),
                 "causes": {c: counts[c] for c in CAUSES}, "problems": found}, f, indent=2)


if __name__ == "__main__":
  # Defined only when run, so that tests importing this beside other benchmarks (which define
  # --out too) do not collide in absl's one flag registry.
  _RECORDS = flags.DEFINE_string("records", None, "JSONL with problem_id, passed and reason.")
  _OUT = flags.DEFINE_string("out", None, "Write the counts and per-problem causes as JSON.")
  app.run(main)
