"""Paired pass@1 of several systems' HumanEval records on the same problems: each system's passes,
and against each reference system the discordant problems and the exact McNemar p-value
(`table2.mcnemar_exact`).

  python -m benchmarks.humaneval_pairs \\
    --records=morse_base=benchmarks/results/qwen25_coder/humaneval_morse_base \\
    --records=single=benchmarks/results/qwen25_coder/humaneval_single \\
    --records=chatchain=RUN/eval_test.jsonl --against=morse_base --against=single \\
    [--out=FILE.json]

A system's records are a JSONL file or a folder of them (a run in chunks); its problems are the
`problem` records' ids. The problems compared are those of the system with the fewest; every
other system must hold all of them (a run of the first N problems beside all 164).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Sequence

from absl import app, flags

from morse_jax.experiments import table2



def problem_passes(path: str) -> dict[str, bool]:
  """{problem id: passed} from a records file, or from every JSONL file of a folder."""
  files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) else (
      [path] if os.path.isfile(path) else [])
  if not files:
    raise ValueError(f"humaneval_pairs: no JSONL records in {path}")
  out = {}
  for f in files:
    out.update({k: bool(v) for k, v in table2.passes(f)["problems"].items()})
  return out


def common_problems(systems: dict[str, dict[str, bool]]) -> list[str]:
  """The problems of the system with the fewest, checked to be in every other."""
  fewest = min(systems, key=lambda name: len(systems[name]))
  ids = sorted(systems[fewest], key=_order)
  for name, passes in systems.items():
    missing = [i for i in ids if i not in passes]
    if missing:
      raise ValueError(f"humaneval_pairs: {name} has no record of {missing[:4]} "
                       f"({len(missing)} of {fewest}'s {len(ids)} problems)")
  return ids


def _order(problem_id: str):
  head, _, number = problem_id.rpartition("/")
  return (head, int(number)) if number.isdigit() else (problem_id, 0)


def pair(a: dict[str, bool], b: dict[str, bool], ids: Sequence[str]) -> dict:
  """a against b on ids: the problems only a passes, only b passes, and McNemar's p."""
  a_only = [i for i in ids if a[i] and not b[i]]
  b_only = [i for i in ids if b[i] and not a[i]]
  return {"a_only": a_only, "b_only": b_only,
          "p_value": table2.mcnemar_exact(len(a_only), len(b_only))}


def table(systems: dict[str, dict[str, bool]], against: Sequence[str]) -> dict:
  unknown = [name for name in against if name not in systems]
  if unknown:
    raise ValueError(f"humaneval_pairs: --against {unknown} has no --records "
                     f"(systems: {sorted(systems)})")
  ids = common_problems(systems)
  return {"problems": ids,
          "passed": {name: sum(p[i] for i in ids) for name, p in systems.items()},
          "pairs": {f"{a} - {b}": pair(systems[a], systems[b], ids)
                    for b in against for a in systems if a != b}}


def print_table(result: dict) -> None:
  n = len(result["problems"])
  print(f"{n} problems: {result['problems'][0]} .. {result['problems'][-1]}")
  for name, passed in result["passed"].items():
    print(f"  {name:12s} {passed:4d} / {n} = {passed / n:.3f}")
  for name, p in result["pairs"].items():
    print(f"  {name:26s} only a {len(p['a_only']):3d}  only b {len(p['b_only']):3d}  "
          f"p = {p['p_value']:.3g}")


def parse_records(specs: Sequence[str]) -> dict[str, str]:
  out = {}
  for spec in specs:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
      raise ValueError(f"humaneval_pairs: --records must be name=path, got {spec!r}")
    out[name] = path
  return out


def main(argv):
  del argv
  paths = parse_records(flags.FLAGS.records)
  result = table({name: problem_passes(path) for name, path in paths.items()}, flags.FLAGS.against)
  result["records"] = paths
  print_table(result)
  if flags.FLAGS.out:
    with open(flags.FLAGS.out, "w") as f:
      json.dump(result, f, indent=2)


def define_flags() -> None:
  """The command line's flags, defined when run as a program, not at import: tests import
  this module beside launchers whose flags share names (absl flags are process-wide)."""
  flags.DEFINE_multi_string("records", [], "name=path: a system's records (a JSONL "
                            "file or a folder of JSONL files), repeatable.")
  flags.DEFINE_multi_string("against", ["morse_base"], "The reference systems each "
                            "other system is paired with.")
  flags.DEFINE_string("out", None, "Write the table as JSON here.")


if __name__ == "__main__":
  define_flags()
  app.run(main)
