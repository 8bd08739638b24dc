"""The APEx chain once per seed (config.seeds), each in <workdir>/seed_<s>, and the ablation rows
side by side: held-out EM / F1 per seed, their mean and spread, and on how many seeds each order
the paper claims holds (full above without memories, without skills and the untrained system).

  python -m launchers.train --config=configs/apex/demo_procedures.py   # seeds (0, 1, 2)

Each seed is a whole `pipeline.run` (its own memory building, stages, TTRL and table; resumable
as that is); the world, its split and every other setting stay the config's.
"""

from __future__ import annotations

import json
import os

from apex_jax import pipeline
from morse_jax.experiments.table2 import mean_std

# (row that should be higher, row that should be lower): the orders the ablation is about
ORDERS = (("full", "without_memories"), ("full", "without_skills"), ("full", "untrained"))


def seed_config(config, seed: int):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.seed, c.seeds = int(seed), ()
    c.workdir = os.path.join(config.workdir, f"seed_{seed}")
  return c


def summarize(per_seed: dict[int, dict[str, dict]]) -> dict:
  """{"rows": {name: {"em": [..], "f1": [..], "f1_mean", "f1_std", "em_mean", "em_std"}},
  "orders": {"full>without_memories": {"f1_held_on": k, "seeds": n, "ties": t}, ...}} from each
  seed's results["eval"] (rows missing in a seed are left out of that seed)."""
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
    if pairs:
      orders[f"{high}>{low}"] = {"f1_held_on": sum(a > b for a, b in pairs),
                                 "ties": sum(a == b for a, b in pairs), "seeds": len(pairs)}
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
    lines.append(f"{order}: F1 higher on {o['f1_held_on']} of {o['seeds']} seeds "
                 f"({o['ties']} ties)")
  return "\n".join(lines)


def run(config) -> dict:
  seeds = tuple(int(s) for s in config.seeds)
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"config.seeds must be distinct integers, got {tuple(config.seeds)!r}")
  per_seed = {}
  for seed in seeds:
    c = seed_config(config, seed)
    print(f"[apex seeds] seed {seed} -> {c.workdir}", flush=True)
    results = pipeline.run(c)
    pipeline.print_summary(results, c.workdir)
    per_seed[seed] = {name: {"em": row["em"], "f1": row["f1"]}
                      for name, row in results["eval"].items()}
  summary = {"seeds": list(seeds), "per_seed": per_seed, **summarize(per_seed)}
  os.makedirs(config.workdir, exist_ok=True)
  with open(os.path.join(config.workdir, "seeds.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  print(f"\nheld-out F1 per seed ({config.workdir}/seeds.json)\n{table(summary)}", flush=True)
  return summary
