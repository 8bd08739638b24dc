"""Training runs side by side: held-out numbers before and after, the reward curve's first half
against its last half, and one plot with a panel per run.

  python -m benchmarks.rl_compare --runs=mole_hgrpo=/tmp/morse_runs/smollm2_train_cpu_mole_hgrpo,\
fixed_grpo=/tmp/morse_runs/smollm2_train_cpu_fixed_grpo \
      --out=benchmarks/results/real_model/rl_smollm2_tier

A run folder is a demo's workdir (`launchers.train` with config.demo): metrics.jsonl, and
demo.json once the run finished. Writes <out>/summary.json (with paired sign-flip tests over the
held-out nodes: each run after against before, and each pair of runs after training),
<out>/reward_curves.png and copies each run's metrics.jsonl, demo.json and evaluation records to
<out>/<name>/.
"""

from __future__ import annotations

import json
import os
import shutil

from absl import app, flags

from morse_jax.experiments import plots
from morse_jax.experiments.table2 import paired_difference, passes
from morse_jax.rl.metrics import read_jsonl

_COPIED = ("metrics.jsonl", "demo.json", "eval_test_before.jsonl", "eval_test_after.jsonl")
_HELD_OUT = ("step_pass", "problem_pass", "step_reward", "seconds")


def parse_runs(text: str) -> dict[str, str]:
  runs = {}
  for item in text.split(","):
    name, sep, folder = item.partition("=")
    if not sep or not name or not folder:
      raise ValueError(f"--runs: {item!r} is not name=folder")
    runs[name] = folder
  return runs


def summarize(folder: str) -> dict:
  """One run: updates, skipped updates, mean reward over the first and the last half of the
  updates, rollout and update seconds, and the held-out numbers before / after (if finished)."""
  rows = read_jsonl(os.path.join(folder, "metrics.jsonl"))
  if not rows:
    raise ValueError(f"rl_compare: {folder}/metrics.jsonl has no updates")
  rewards = [r["reward_mean"] for r in rows]
  half = len(rewards) // 2
  out = {"updates": len(rows),
         "skipped_updates": int(sum(r.get("skipped", 0) for r in rows)),
         "reward_first_half": sum(rewards[:half]) / half if half else None,
         "reward_last_half": sum(rewards[half:]) / (len(rewards) - half),
         "rollout_s": sum(r.get("time_rollout_s", 0.0) for r in rows),
         "update_s": sum(r.get("time_update_s", 0.0) for r in rows)}
  demo = os.path.join(folder, "demo.json")
  if os.path.exists(demo):
    with open(demo) as f:
      done = json.load(f)
    for key in _HELD_OUT:
      if key in done["before"] and key in done["after"]:
        out[f"before_{key}"], out[f"after_{key}"] = done["before"][key], done["after"][key]
  return out


def paired(a: dict[str, float], b: dict[str, float], what: str) -> dict:
  """a - b over the held-out nodes both evaluated: how many a passes and b fails, the reverse,
  and the sign-flip p-value of the mean difference."""
  if set(a) != set(b):
    raise ValueError(f"rl_compare: {what}: the evaluations hold different nodes "
                     f"({sorted(set(a) ^ set(b))[:4]} ...)")
  test = paired_difference([a[k] - b[k] for k in sorted(a)])
  return {"nodes": len(a), "mean_difference": test["mean_difference"],
          "better": test["a_better"], "worse": test["b_better"], "p_value": test["p_value"]}


def before_records(folder: str) -> str | None:
  """The untrained measurement's records a finished run names in its demo.json, if any."""
  demo = os.path.join(folder, "demo.json")
  if not os.path.exists(demo):
    return None
  with open(demo) as f:
    return json.load(f).get("before_records")


def paired_tests(runs: dict[str, str]) -> dict:
  """Paired tests of every finished run (its after against its before) and of every two runs
  after training."""
  after = {}
  out = {}
  for name, folder in runs.items():
    before_path, after_path = (os.path.join(folder, f"eval_test_{w}.jsonl")
                               for w in ("before", "after"))
    if not os.path.exists(after_path):
      continue
    if not os.path.exists(before_path):  # a run that reused another's untrained measurement
      before_path = before_records(folder) or before_path
    after[name] = passes(after_path)["nodes"]
    if os.path.exists(before_path):
      out[f"{name} after - before"] = paired(after[name], passes(before_path)["nodes"], name)
  names = sorted(after)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      out[f"{a} - {b} after"] = paired(after[a], after[b], f"{a} against {b}")
  return out


def compare(runs: dict[str, str], out: str) -> dict:
  os.makedirs(out, exist_ok=True)
  summary = {name: summarize(folder) for name, folder in runs.items()}
  held = {name: [(0, s["before_step_reward"]), (s["updates"], s["after_step_reward"])]
          for name, s in summary.items() if "before_step_reward" in s}
  plots.variant_panels({n: os.path.join(f, "metrics.jsonl") for n, f in runs.items()},
                       os.path.join(out, "reward_curves.png"), held_out=held)
  for name, folder in runs.items():
    os.makedirs(os.path.join(out, name), exist_ok=True)
    for file in _COPIED:
      if os.path.exists(os.path.join(folder, file)):
        shutil.copy(os.path.join(folder, file), os.path.join(out, name, file))
  summary["paired_tests"] = paired_tests(runs)
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def main(argv):
  del argv
  if not _RUNS.value or not _OUT.value:
    raise app.UsageError("--runs and --out are required")
  print(json.dumps(compare(parse_runs(_RUNS.value), _OUT.value), indent=2))


if __name__ == "__main__":
  # Defined only when run, so that tests importing this beside other benchmarks (which define
  # --out too) do not collide in absl's one flag registry.
  _RUNS = flags.DEFINE_string("runs", None, "name=folder,name=folder,... (demo workdirs).")
  _OUT = flags.DEFINE_string("out", None, "Folder for summary.json, the plot and the copies.")
  app.run(main)
