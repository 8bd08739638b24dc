"""Measures the null baseline of every scorable node of the shipped task families and writes them
as package data (`morse_jax/tasks/data/null_baselines.json`), read by the families
(`nulls.stored`) when the key matches: the 50 tested SciCode dev steps (targets from gold code)
and the 164 HumanEval problems. Prints, per family, the nodes whose baseline is above 0 and those
a null program passes entirely (which earn no reward of their own).

  python -m benchmarks.null_baselines [--families=scicode,humaneval]
      [--out=morse_jax/tasks/data/null_baselines.json]
"""

from __future__ import annotations

import collections
import json
import os
import time

from absl import app, flags

from morse_jax.tasks import humaneval, nulls, scicode

_FAMILIES = flags.DEFINE_list("families", ["scicode", "humaneval"], "families to measure")
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(nulls.__file__), "data",
                                               nulls.DATA), "JSON written (merged by family)")


def _scicode() -> dict[str, dict]:
  family = scicode.SciCode()
  out = {}
  for p in scicode.load():
    if not scicode.has_gold(p):
      continue
    for step in p.data["sub_steps"]:
      if not step["test_cases"] or scicode.property_only(step):
        continue
      sid = scicode.step_id(p.id, step["step_number"])
      out[sid] = {"key": family.null_key(p, step), "baseline": family.null_baseline(p, step),
                  "tests": len(step["test_cases"])}
      print(f"  scicode {sid}: {out[sid]['baseline']} of {out[sid]['tests']}", flush=True)
  return out


def _humaneval() -> dict[str, dict]:
  family = humaneval.HumanEval()
  out = {}
  for p in humaneval.load():
    out[p.id] = {"key": family.null_key(p), "baseline": family.null_baseline(p), "tests": 1}
  return out


def main(argv):
  del argv
  data = {}
  if os.path.exists(_OUT.value):
    with open(_OUT.value, encoding="utf-8") as f:
      data = json.load(f)
  for name in _FAMILIES.value:
    start = time.monotonic()
    measured = {"scicode": _scicode, "humaneval": _humaneval}[name]()
    data[name] = measured
    counts = collections.Counter("all" if v["baseline"] >= v["tests"] else
                                 "some" if v["baseline"] else "none" for v in measured.values())
    print(f"{name}: {len(measured)} nodes; baseline 0: {counts['none']}, above 0: "
          f"{counts['some']}, every test: {counts['all']} "
          f"({[k for k, v in measured.items() if v['baseline'] >= v['tests']]}); "
          f"{time.monotonic() - start:.0f} s", flush=True)
  data["version"] = nulls.VERSION
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=0, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  app.run(main)
