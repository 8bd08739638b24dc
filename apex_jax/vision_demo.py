"""The demo that sees (configs/apex/demo_vision.py, `make demo-apex-vision`): the systems of
`config.systems` (name -> whether the image-search tool is offered, whether the bank keeps
captions), each over the config's seeds (`apex_jax.seeds`) in <workdir>/<name>, one after the
other in one process (the compiled steps are shared), then one table: held-out F1 per seed of
each system's `full` row, and two paired comparisons over the pooled questions (per question,
the two systems' F1 difference and the sign-flip test of its mean, as the demo's orders): the
tool against none (both with text-image memories), text-image memories against text-only ones
(both with the tool). Written to <workdir>/vision.json.
"""

from __future__ import annotations

import json
import os
import time

from apex_jax import seeds as seeds_lib
from morse_jax.experiments.table2 import paired_difference

COMPARISONS = (("tool,text_image", "no_tool,text_image"), ("tool,text_image", "tool,no_text_image"))


def system_config(config, name: str):
  """The config of one system: its switches set, its own workdir, no systems under it."""
  switches = config.systems[name]
  unknown = sorted(set(switches) - {"image_search", "text_image"})
  if unknown or not all(isinstance(v, bool) for v in switches.values()):
    raise ValueError(f"config.systems[{name!r}] must hold bools image_search / text_image; got "
                     f"{dict(switches)!r}")
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.systems = {}
    c.workdir = os.path.join(config.workdir, name.replace(",", "_"))
    c.image_search.enabled = switches["image_search"]
    c.memory.bank.text_image = switches["text_image"]
  return c


def compare(per_seed: dict, high: str, low: str) -> dict:
  """On how many seeds `high`'s F1 is above `low`'s, and the pooled questions' paired test."""
  pairs = [(per_seed[s][high], per_seed[s][low]) for s in per_seed]
  differences = [a["f1_per_question"][q] - b["f1_per_question"][q]
                 for a, b in pairs for q in sorted(a["f1_per_question"])]
  return {"f1_higher_on": sum(a["f1"] > b["f1"] for a, b in pairs),
          "ties": sum(a["f1"] == b["f1"] for a, b in pairs), "seeds": len(pairs),
          "questions": paired_difference(differences)}


def table(per_seed: dict, systems, comparisons: dict) -> str:
  summary = seeds_lib.summarize({s: {name: rows[name] for name in systems}
                                 for s, rows in per_seed.items()})
  lines = [seeds_lib.table({"rows": summary["rows"], "orders": {}})]
  for key, o in comparisons.items():
    q = o["questions"]
    lines.append(f"{key}: F1 higher on {o['f1_higher_on']} of {o['seeds']} seeds ({o['ties']} "
                 f"ties); pooled questions: {q['a_better']} better, {q['b_better']} worse, mean "
                 f"{q['mean_difference']:+.3f}, p {q['p_value']:.3f}")
  return "\n".join(lines)


def run(config, one_seed=seeds_lib.chain) -> dict:
  start, per_seed, seconds = time.time(), {}, {}
  names = list(config.systems)
  for name in names:
    t0 = time.time()
    summary = seeds_lib.run(system_config(config, name), one_seed=one_seed)
    seconds[name] = round(time.time() - t0, 1)
    for seed, rows in summary["per_seed"].items():
      per_seed.setdefault(seed, {})[name] = rows["full"]
  comparisons = {f"{a} > {b}": compare(per_seed, a, b) for a, b in COMPARISONS
                 if a in names and b in names}
  result = {"per_seed": per_seed, "comparisons": comparisons, "seconds": seconds,
            "total_seconds": round(time.time() - start, 1)}
  print(f"\nthe demo that sees: held-out F1 of each system (its `full` row)\n"
        f"{table(per_seed, names, comparisons)}\n"
        f"wall time {result['total_seconds']:.0f} s ({seconds})", flush=True)
  os.makedirs(config.workdir, exist_ok=True)
  with open(os.path.join(config.workdir, "vision.json"), "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  return result
