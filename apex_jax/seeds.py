"""The APEx chain once per seed (config.seeds), each in <workdir>/seed_<s>, and the ablation rows
side by side: held-out EM / F1 per seed, their mean and spread, and on how many seeds each order
the paper claims holds (full above without memories, without skills and the untrained system).

  python -m launchers.train --config=configs/apex/demo_procedures.py   # seeds (0, 1, 2)

Each seed is a whole `pipeline.run` (its own memory building, stages, TTRL and table; resumable
as that is); every other setting stays the config's, and the world too unless `seed_worlds` is
set: then seed s reads world `data.world_seed + s`, so that the seeds are independent draws of the
experience effect (a greedy memory-building pass on one world is the same on every seed). Each
order is also tested over the questions of all seeds pooled: per question, the two rows' F1
difference, and the paired sign-flip test of their mean (morse_jax.experiments.table2). `seed_workers` > 1
runs that many seeds at once, each in its own spawned process printing to <workdir>/seed_<s>/log.txt:
the toy's steps are too small to keep two cores busy from one process, and seeds share nothing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import multiprocessing
import os

from apex_jax import pipeline
from apex_jax.baselines import SYSTEMS
from morse_jax.experiments.table2 import mean_std, paired_difference

# (row that should be higher, row that should be lower): the orders the ablation is about, and
# APEx above each comparison system (config.eval.baselines; a row absent from a run is skipped)
ORDERS = (("full", "without_memories"), ("full", "without_skills"), ("full", "untrained")) + \
    tuple(("full", name) for name in SYSTEMS)


def seed_config(config, seed: int):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.seed, c.seeds = int(seed), ()
    c.workdir = os.path.join(config.workdir, f"seed_{seed}")
    if config.get("seed_worlds", False):
      c.data.world_seed = int(config.data.world_seed) + int(seed)
  return c


def summarize(per_seed: dict[int, dict[str, dict]]) -> dict:
  """{"rows": {name: {"em": [..], "f1": [..], "f1_mean", "f1_std", "em_mean", "em_std"}},
  "orders": {"full>without_memories": {"f1_held_on": k, "seeds": n, "ties": t, "questions":
  paired_difference of the per-question F1 over every seed's questions}, ...}} from each seed's
  results["eval"] (rows missing in a seed are left out of that seed; "questions" only where the
  rows carry "f1_per_question")."""
  names = list(dict.fromkeys(n for rows in per_seed.values() for n in rows))
  rows = {}
  for name in names:
    got = [per_seed[s][name] for s in per_seed if name in per_seed[s]]
    row = {"seeds": [s for s in per_seed if name in per_seed[s]]}
    for key in ("em", "f1"):
      row[key] = [r[key] for r in got]
      row[f"{key}_mean"], row[f"{key}_std"] = mean_std(row[key])
    rows[name] = row
  orders = {}
  for high, low in ORDERS:
    pairs = [(per_seed[s][high]["f1"], per_seed[s][low]["f1"]) for s in per_seed
             if high in per_seed[s] and low in per_seed[s]]
    if not pairs:
      continue
    order = {"f1_held_on": sum(a > b for a, b in pairs), "ties": sum(a == b for a, b in pairs),
             "seeds": len(pairs)}
    differences = []
    for rows_of_seed in per_seed.values():
      a = rows_of_seed.get(high, {}).get("f1_per_question")
      b = rows_of_seed.get(low, {}).get("f1_per_question")
      if a is not None and b is not None:
        differences += [a[q] - b[q] for q in sorted(a)]
    if differences:
      order["questions"] = paired_difference(differences)
    orders[f"{high}>{low}"] = order
  return {"rows": rows, "orders": orders}


def table(summary: dict) -> str:
  rows = summary["rows"]
  seeds = max((len(r["f1"]) for r in rows.values()), default=0)
  head = f"{'system':<28} " + " ".join(f"{'F1 s' + str(i):>7}" for i in range(seeds))
  lines = [head + f" {'F1 mean':>8} {'+-':>6} {'EM mean':>8}"]
  for name, r in rows.items():
    cells = " ".join(f"{v:>7.3f}" for v in r["f1"]) + " " * 8 * (seeds - len(r["f1"]))
    lines.append(f"{name:<28} {cells} {r['f1_mean']:>8.3f} {r['f1_std']:>6.3f} "
                 f"{r['em_mean']:>8.3f}")
  for order, o in summary["orders"].items():
    pooled = "" if "questions" not in o else (
        f"; pooled questions: {o['questions']['a_better']} better, {o['questions']['b_better']}"
        f" worse, mean {o['questions']['mean_difference']:+.3f}, p {o['questions']['p_value']:.3f}")
    lines.append(f"{order}: F1 higher on {o['f1_held_on']} of {o['seeds']} seeds "
                 f"({o['ties']} ties){pooled}")
  return "\n".join(lines)


def chain(c) -> dict[str, dict]:
  """One seed's whole chain (`pipeline.run`): its rows' EM / F1."""
  results = pipeline.run(c)
  pipeline.print_summary(results, c.workdir)
  return {name: {"em": row["em"], "f1": row["f1"], "f1_per_question": row["f1_per_question"]}
          for name, row in results["eval"].items()}


def in_worker(one_seed, c, log: str) -> dict[str, dict]:
  """`one_seed(c)` in a worker process, its output appended to `log`."""
  os.makedirs(os.path.dirname(log), exist_ok=True)
  with open(log, "a", buffering=1) as out, contextlib.redirect_stdout(out), \
      contextlib.redirect_stderr(out):
    return one_seed(c)


def workers(config) -> int:
  n = config.get("seed_workers", 1)
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"config.seed_workers must be an integer >= 1, got {n!r}")
  return n


def run(config, one_seed=chain) -> dict:
  seeds = tuple(int(s) for s in config.seeds)
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"config.seeds must be distinct integers, got {tuple(config.seeds)!r}")
  n = min(workers(config), len(seeds))
  configs = {seed: seed_config(config, seed) for seed in seeds}
  per_seed = {}
  if n == 1:
    for seed, c in configs.items():
      print(f"[apex seeds] seed {seed} -> {c.workdir}", flush=True)
      per_seed[seed] = one_seed(c)
  else:  # spawned, not forked: the parent's JAX runtime and threads must not be copied
    pool = concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
    with pool:
      futures = {}
      for seed, c in configs.items():
        log = os.path.join(c.workdir, "log.txt")
        print(f"[apex seeds] seed {seed} -> {c.workdir} (output: {log})", flush=True)
        futures[seed] = pool.submit(in_worker, one_seed, c, log)
      for seed in seeds:  # in the config's order; a failed seed raises here with its error
        per_seed[seed] = futures[seed].result()
        print(f"[apex seeds] seed {seed} done", flush=True)
  summary = {"seeds": list(seeds), "per_seed": per_seed, **summarize(per_seed)}
  os.makedirs(config.workdir, exist_ok=True)
  with open(os.path.join(config.workdir, "seeds.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  print(f"\nheld-out F1 per seed ({config.workdir}/seeds.json)\n{table(summary)}", flush=True)
  return summary
