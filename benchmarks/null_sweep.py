"""The null-program sweep: every null program (`morse_jax.experiments.null_programs`: the generic
ones and each node's own: its targets as constants, zeros / ones like them, its parents' results)
on every problem and step of every task family shipped; a reply that computes nothing must earn
reward 0 on each.

  python -m benchmarks.null_sweep [--families=humaneval,scicode,synthetic,srdd]
      [--per_op=3] [--limit=0] [--workers=2] [--which=all|generic|own]
      [--out=benchmarks/results/null_sweep.json]

Families: HumanEval (164 problems), SciCode dev (the 15 problems whose targets come from gold
code: 50 steps, each after the gold code of its earlier steps), the synthetic suite of the demo
config (generate(800, seed 100); its 3676 subtasks are instances of 65 ops, so `per_op` of each
op, 0: all), SRDD (the test fixture's problems, a bag-of-words embedder). Time limits are the
families' defaults except SciCode's (60 s a step, 10 s a test, instead of 300 / 120: only the
sleeping null program reaches them). Prints per family: cases (problems x steps x null
programs), how many earned reward > 0 and reward 1.0, and the offending cases; writes JSON.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import time
import zlib

from absl import app, flags
import numpy as np

from morse_jax.experiments import null_programs
from morse_jax.tasks import humaneval, scicode, srdd, synthetic

FAMILIES = ("humaneval", "scicode", "synthetic", "srdd")
_FAMILIES = flags.DEFINE_list("families", list(FAMILIES), "families to sweep")
_PER_OP = flags.DEFINE_integer("per_op", 3, "synthetic: subtasks per op (0: every subtask)")
_LIMIT = flags.DEFINE_integer("limit", 0, "problems per family (0: all)")
_WORKERS = flags.DEFINE_integer("workers", 2, "sandbox runs in flight at once")
_WHICH = flags.DEFINE_enum("which", "all", ["all", "generic", "own"],
                           "null programs: all, the generic ones, or each node's own")
_OUT = flags.DEFINE_string("out", "benchmarks/results/null_sweep.json", "JSON output")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRDD_FIXTURE = os.path.join(_ROOT, "tests", "tasks", "fixtures", "srdd_mini.csv")


def bag_of_words(texts):
  """A deterministic stand-in for a sentence embedder: hashed word counts."""
  out = np.zeros((len(texts), 64))
  for row, text in enumerate(texts):
    for word in re.findall(r"[a-z]+", text.lower()):
      out[row, zlib.crc32(word.encode()) % 64] += 1.0
  return out


def synthetic_sample(problems, per_op):
  """(problem, node id) of the first `per_op` subtasks of each op (0: all), in suite order."""
  seen, out = collections.Counter(), []
  for p in problems:
    for node_id, spec in p.data["nodes"].items():
      if not per_op or seen[spec["op"]] < per_op:
        seen[spec["op"]] += 1
        out.append((p, node_id))
  return out


def cases(name, limit=0, per_op=3):
  """(family, [(problem, node id)]) of one family, as swept."""
  if name == "humaneval":
    family, problems = humaneval.HumanEval(), humaneval.load()
  elif name == "scicode":
    family = scicode.SciCode(timeout_s=60.0, per_test_timeout_s=10.0)
    problems = [p for p in scicode.load() if scicode.has_gold(p)]
  elif name == "synthetic":
    family, problems = synthetic.Synthetic(), synthetic.generate(800, 100)
    problems = problems[:limit] if limit else problems
    return family, synthetic_sample(problems, per_op)
  elif name == "srdd":
    family, problems = srdd.SRDD(embedder=bag_of_words, timeout_s=2.0), srdd.load(SRDD_FIXTURE)
  else:
    raise ValueError(f"null_sweep: family {name!r}; expected one of {FAMILIES}")
  problems = problems[:limit] if limit else problems
  return family, [(p, n) for p in problems for n in null_programs.nodes(p)]


def sweep(name, limit=0, per_op=3, workers=2, which="all"):
  """Scores every null program (`null_programs.node_nulls`: the generic ones and each node's
  own; which="generic" / "own": one kind only) on every case of one family: a summary dict."""
  family, found = cases(name, limit, per_op)
  jobs = [(p, n, null, body) for p, n in found
          for null, body in null_programs.node_nulls(family, p, n).items()
          if which == "all" or (body is None) == (which == "generic")]
  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    rewards = list(pool.map(lambda job: null_programs.score(family, *job), jobs))
  hits = [{"problem": p.id, "node": n, "null": null, "reward": round(r, 4)}
          for (p, n, null, _), r in zip(jobs, rewards) if r > 0]
  return {"family": name, "problems": len({p.id for p, _ in found}), "nodes": len(found),
          "null_programs": len({null for _, _, null, _ in jobs}), "which": which,
          "cases": len(jobs), "reward_gt_0": len(hits),
          "reward_1": sum(h["reward"] == 1.0 for h in hits),
          "by_null": dict(collections.Counter(h["null"] for h in hits)),
          "seconds": round(time.monotonic() - start, 1), "hits": hits}


def main(argv):
  del argv
  results = []
  print(f"{'family':10} {'problems':>8} {'nodes':>6} {'cases':>6} {'reward>0':>9} "
        f"{'reward=1':>9} {'seconds':>8}", flush=True)
  for name in _FAMILIES.value:  # each family's line, hits and JSON as soon as it is done
    r = sweep(name, _LIMIT.value, _PER_OP.value, _WORKERS.value, _WHICH.value)
    results.append(r)
    print(f"{name:10} {r['problems']:8d} {r['nodes']:6d} {r['cases']:6d} {r['reward_gt_0']:9d} "
          f"{r['reward_1']:9d} {r['seconds']:8.1f}", flush=True)
    for hit in r["hits"][:40]:
      print(f"  {hit['problem']} node {hit['node']}: {hit['null']!r} -> {hit['reward']}",
            flush=True)
    if _OUT.value:
      os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
      with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump({"families": results, "per_op": _PER_OP.value, "limit": _LIMIT.value}, f,
                  indent=1)


if __name__ == "__main__":
  app.run(main)
