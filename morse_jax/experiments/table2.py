"""MoRSE's Table 2 on one suite: the paper's five systems, trained variants over several seeds
with the same number of updates, one shared measurement of each untrained system, and a paired
test per comparison.

`run(config)` reads `config.table2` (`variants`, `seeds`, `steps`, `comparisons`) and writes
`<workdir>/table2.json` and `<workdir>/table2_rewards.png` (`plot`); each run's workdir is
`<workdir>/<variant>/seed<k>` (the untrained systems: `<workdir>/<variant>`), holding its
metrics, checkpoints, per-node records and, once finished, `table2_run.json`: the same command
run again skips the finished runs and resumes the table.

The paired tests are over held-out nodes and over held-out problems: for each node (problem), a
system's score is its pass rate over the seeds (0 or 1 for an untrained system, which is greedy
and so seed-free); the statistic is the mean of the per-node differences and the p-value is the
two-sided sign-flip permutation test of that mean (exact when at most 16 differ, else 20,000
random flips with a fixed seed). Units pair because every system runs the same held-out
problems; MoRSE's systems also share the gold graphs, so their nodes pair too (`single` makes
one call per problem, so only its problems pair). A node whose parent failed counts as failed,
as the step pass metric counts it.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
from typing import Sequence

import numpy as np

from morse_jax import atomic
from morse_jax.baselines import run as baselines
from morse_jax.experiments import pipeline, plots
from morse_jax.experiments.variants import VARIANTS
from morse_jax.rl import metrics

# The prompt-level baselines (chatchain, macnet, aflow) are untrained systems too: a HumanEval
# table of them beside morse_base pairs over problems, as `single` does.
UNTRAINED = ("single", "morse_base") + baselines.SYSTEMS
TRAINED = ("fixed_grpo", "mole_grpo", "mole_hgrpo")
_EXACT_UP_TO = 16
_RANDOM_FLIPS = 20_000
DONE = "table2_run.json"
UNITS = ("nodes", "problems", "problem_steps")


def sign_flip_test(differences: Sequence[float], seed: int = 0) -> float:
  """Two-sided p-value of mean(differences) under random sign flips (the paired permutation
  test). Zeros carry no sign and are left out of the flips but kept in the mean."""
  d = np.asarray(differences, np.float64)
  nonzero = d[d != 0]
  if nonzero.size == 0:
    return 1.0
  observed = abs(d.sum())
  if nonzero.size <= _EXACT_UP_TO:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=nonzero.size)))
  else:
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(_RANDOM_FLIPS, nonzero.size))
  sums = np.abs(signs @ nonzero)
  return float(np.mean(sums >= observed - 1e-12))


def mcnemar_exact(a_only: int, b_only: int) -> float:
  """Exact McNemar p-value of two pass / fail columns over the same problems: two-sided
  binomial(a_only + b_only, 1/2) on the discordant pairs (a passes and b fails, the reverse),
  twice the smaller tail, at most 1. For 0 / 1 scores it is `sign_flip_test`'s exact value."""
  for name, value in (("a_only", a_only), ("b_only", b_only)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
      raise ValueError(f"mcnemar_exact: {name} must be a count >= 0, got {value!r}")
  n = a_only + b_only
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1))
  return min(1.0, 2 * tail / 2 ** n)


def paired_difference(differences: Sequence[float]) -> dict:
  """a - b per paired unit: the mean, how many units a is better / worse on, the sign-flip p."""
  d = np.asarray(differences, dtype=float)
  return {"mean_difference": float(d.mean()), "a_better": int((d > 0).sum()),
          "b_better": int((d < 0).sum()), "p_value": sign_flip_test(d)}


def passes(records_path: str) -> dict[str, dict[str, float]]:
  """{"nodes": {problem/node: 1.0 or 0.0}, "problems": {problem: 1.0 or 0.0},
  "problem_steps": {problem: the family's step pass}} from an evaluation's records
  (records.write). The family's step pass scores a problem's steps whatever the system's graph
  (`single` answers the whole problem in one node), so it pairs every system."""
  out = {"nodes": {}, "problems": {}, "problem_steps": {}}
  with open(records_path) as f:
    for line in f:
      row = json.loads(line)
      if row.get("kind") == "node":
        out["nodes"][f"{row['problem_id']}/{row['node_id']}"] = float(bool(row["passed"]))
      elif row.get("kind") == "problem":
        out["problems"][row["problem_id"]] = float(bool(row["passed"]))
        out["problem_steps"][row["problem_id"]] = _family_step_pass(row)
  if not out["problems"]:
    raise ValueError(f"table2: no problem records in {records_path}")
  return out


def _family_step_pass(problem_row: dict) -> float:
  metrics = problem_row.get("metrics") or {}
  return float(metrics.get("step_pass", bool(problem_row["passed"])))


def summary_from_records(records_path: str) -> dict[str, float]:
  """The evaluation summary's pass figures recomputed from its records (as
  `evaluation.summarize` computes them from the outcomes)."""
  nodes, problems, family, per_problem = [], [], [], {}
  with open(records_path) as f:
    for line in f:
      row = json.loads(line)
      if row.get("kind") == "node":
        nodes.append((float(bool(row["passed"])), float(row["reward"])))
        per_problem.setdefault(row["problem_id"], []).append(float(bool(row["passed"])))
      elif row.get("kind") == "problem":
        problems.append(float(bool(row["passed"])))
        family.append(_family_step_pass(row))
  if not problems or not nodes:
    raise ValueError(f"table2: no node or problem records in {records_path}")
  return {"step_pass": float(np.mean([p for p, _ in nodes])),
          "mean_step_pass": float(np.mean([np.mean(v) for v in per_problem.values()])),
          "problem_pass": float(np.mean(problems)),
          "family_step_pass": float(np.mean(family)),
          "step_reward": float(np.mean([r for _, r in nodes]))}


def _variant_config(config, variant: str, seed: int, workdir: str):
  c = copy.deepcopy(config)
  with c.unlocked():
    v = VARIANTS[variant]
    c.system, c.mixture, c.algo = v["system"], v["mixture"], v["algo"]
    c.seed, c.workdir, c.demo = seed, workdir, False
    c.train.steps = int(config.table2.steps) if variant in TRAINED else 0
    c.train.max_minutes = 0.0
  return c


def _one_run(config, variant: str, seed: int | None, root: str) -> dict:
  workdir = os.path.join(root, variant) if seed is None else os.path.join(root, variant,
                                                                            f"seed{seed}")
  done = os.path.join(workdir, DONE)
  if os.path.exists(done):  # finished by an earlier invocation: the table resumes
    with open(done) as f:
      return json.load(f)
  c = _variant_config(config, variant, config.seed if seed is None else seed, workdir)
  updates = 0
  if seed is not None:
    pipeline.banner(f"{variant}, seed {seed}: train {c.train.steps} updates")
    pipeline.train(c)
    updates = len(metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  pipeline.banner(f"{variant}" + ("" if seed is None else f", seed {seed}") + ": evaluate")
  checkpoint = os.path.join(workdir, "ckpt") if seed is not None else None
  summary = pipeline.evaluate(c, checkpoint, "test", name="eval_test")
  return finish(variant, seed, updates, workdir, summary["records"])


def finish(variant: str, seed: int | None, updates: int, workdir: str, records_path: str) -> dict:
  """The run's row from its evaluation records, also written to `<workdir>/table2_run.json`
  (atomically) so that a later invocation reuses it instead of running it again."""
  run = {"variant": variant, "seed": seed, "updates": updates, "workdir": workdir,
         "summary": summary_from_records(records_path), **passes(records_path)}
  atomic.write_text(os.path.join(workdir, DONE), json.dumps(run))
  return run


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """The mean and the sample standard deviation over seeds (ddof 1; 0 for one value)."""
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else 0.0


def summarize(runs: Sequence[dict], comparisons: Sequence[Sequence[str]]) -> dict:
  """Mean and spread (sample std over seeds, 0 for one run) of held-out step pass (nodes), the
  family's step pass (mean over problems) and problem pass per variant, and the paired tests of
  each (a, b) comparison, a - b, over nodes, problems and the problems' family step pass."""
  by_variant: dict[str, list[dict]] = {}
  for r in runs:
    by_variant.setdefault(r["variant"], []).append(r)
  rows = {}
  for variant, rs in by_variant.items():
    row = {"seeds": [r["seed"] for r in rs], "updates": [r["updates"] for r in rs]}
    for k in ("step_pass", "family_step_pass", "problem_pass"):
      values = [float(r["summary"][k]) for r in rs]
      mean, std = mean_std(values)
      row[k] = {"mean": mean, "std": std, "runs": values}
    rows[variant] = row
  means = {(v, unit): _seed_means(rs, unit) for v, rs in by_variant.items()
           for unit in UNITS}
  tests = []
  for a, b in comparisons:
    if a not in by_variant or b not in by_variant:
      continue
    for unit in UNITS:
      (ka, ma), (kb, mb) = means[a, unit], means[b, unit]
      if ka != kb:  # `single` runs one node per problem: only its problems pair with MoRSE's
        continue
      tests.append({"a": a, "b": b, "unit": unit, "paired": len(ma),
                    **paired_difference(ma - mb)})
  return {"rows": rows, "tests": tests}


def _seed_means(runs: Sequence[dict], unit: str) -> tuple[list[str], np.ndarray]:
  """The keys (nodes or problems) and each one's pass rate over the runs' seeds."""
  keys = sorted(runs[0][unit])
  for r in runs[1:]:
    if sorted(r[unit]) != keys:
      raise ValueError(f"table2: {r['variant']} seed {r['seed']} evaluated other {unit}")
  return keys, np.mean([[r[unit][k] for k in keys] for r in runs], axis=0)


def run(config) -> dict:
  t = config.table2
  root = os.path.abspath(config.workdir)
  os.makedirs(root, exist_ok=True)
  runs = []
  for variant in t.variants:
    if variant in UNTRAINED:
      runs.append(_one_run(config, variant, None, root))
    elif variant in TRAINED:
      runs += [_one_run(config, variant, int(s), root) for s in t.seeds]
    else:
      raise ValueError(f"config.table2.variants: {variant!r} is not one of "
                       f"{UNTRAINED + TRAINED}")
  result = {"config": {"variants": list(t.variants), "seeds": list(t.seeds),
                       "steps": int(t.steps)},
            **summarize(runs, [tuple(c) for c in t.comparisons]),
            "runs": [{k: v for k, v in r.items() if k not in UNITS}
                     for r in runs]}
  with open(os.path.join(root, "table2.json"), "w") as f:
    json.dump(result, f, indent=2)
  print_table(result)
  if any(r["variant"] in TRAINED for r in result["runs"]):
    print(f"plot: {plot(result, os.path.join(root, 'table2_rewards.png'))}")
  return result


def plot(result: dict, path: str) -> str:
  """The trained variants' reward curves, one panel per variant with one curve per seed (raw
  and EMA), and each variant's held-out step pass as points: the untrained `morse_base` at
  update 0 (when measured) and the variant's mean over seeds after its updates."""
  runs, held_out = {}, {}
  base = result["rows"].get("morse_base")
  for variant, row in result["rows"].items():
    if variant not in TRAINED:
      continue
    runs[variant] = {f"seed {r['seed']}": os.path.join(r["workdir"], "metrics.jsonl")
                     for r in result["runs"] if r["variant"] == variant}
    points = [(0, base["step_pass"]["mean"])] if base else []
    held_out[variant] = points + [(float(np.mean(row["updates"])), row["step_pass"]["mean"])]
  return plots.variant_panels(runs, path, held_out=held_out,
                              ylabel="step reward; held-out step pass")


def print_table(result: dict) -> None:
  print("\n==== Table 2: held-out step pass (nodes) / family step pass (per problem) / problem "
        "pass, mean +- std over seeds")
  print(f"{'system':<12} {'seeds':>5} {'updates':>9} {'step pass':>17} {'family step':>17} "
        f"{'problem pass':>17}")
  for variant, row in result["rows"].items():
    updates = "-" if not any(row["updates"]) else "/".join(str(u) for u in row["updates"])
    cells = " ".join(f"{row[k]['mean']:>8.3f} +- {row[k]['std']:.3f}"
                     for k in ("step_pass", "family_step_pass", "problem_pass"))
    print(f"{variant:<12} {len(row['seeds']):>5} {updates:>9} {cells}")
  for test in result["tests"]:
    print(f"{test['a']} - {test['b']} over {test['paired']} {test['unit']}: "
          f"{test['mean_difference']:+.3f} ({test['a_better']} better, {test['b_better']} "
          f"worse), paired sign-flip p = {test['p_value']:.3f}")
