"""A fuzzer that looks for slow inputs to every parser of model text, and how their time grows.

  python -m benchmarks.parser_fuzz [--parsers=plan,skills --candidates=120 --screen=8000
                                    --sizes=10000,100000 --keep=2 --seed=0
                                    --out=benchmarks/results/parser_fuzz_cpu.json]

An input is `prefix + unit * k + suffix`, k chosen for the size wanted: the runs that make a
backtracking regex or a restarting scan quadratic (fences, backticks, spaces, newlines, braces,
quotes, `<tags>`, brackets, digits, labels such as `score:`). Per parser: `--candidates` random
(prefix, unit, suffix) triples, each timed once at `--screen` characters; the `--keep` slowest
are then timed at each of `--sizes` (best of three, CPU time) and reported in seconds per KB.
Linear time shows as about the same s/KB at both sizes; quadratic as ten times more at ten times
the size.
The probe's input (three backticks, then spaces) is measured for every parser too.

`PARSERS` (name -> a call on one text that swallows the parser's documented errors) is the list
of parsers the regression test `tests/test_parsers_linear.py` times.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import time
from typing import Callable

from apex_jax.agents.planner import parse_decision
from apex_jax.agents.prompts import after_think, rule_workflow
from apex_jax.judges import replies
from apex_jax.judges.align import AlignJudge
from apex_jax.judges.llm_judge import LlmJudge
from apex_jax.judges.nogt import NoGtJudge
from apex_jax.judges.rule import normalize_answer
from apex_jax.judges.skill_judge import SkillJudge
from apex_jax.memory import skills
from apex_jax.memory.buckets import parse_category
from apex_jax.memory.schema import MemoryBankError, as_bucket
from apex_jax.tools.protocol import parse_tool_call, parse_turn
from apex_jax.training import rewards
from morse_jax import jsonsafe
from morse_jax.execution import verifier
from morse_jax.mas.graph import GraphError
from morse_jax.mas.planner import parse_plan
from morse_jax.tasks import srdd

PREFIXES = ["", "```", "```json", "```python\n", "x", "{", '{"a": ', "[", "<think>",
            "<tool_call>", "<tool_call>{", "<answer>", "score:", "Score: ", "reason:",
            "Verdict:", "final ", "1", "def f():\n", "pass", "  ", "\n"]
UNITS = ["```", "`", " ", "\n", "\t", "{", "}", '"', "[", "]", "\\", ":", "*", ".", "1", "a",
         "<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>",
         "<tool_call>{", "} </tool_call>", "```json\n", "```\n", "``` ", "\n```\n", " \n",
         "\n\n", "pass\n", "# c\n", "def f():\n", "def f():\n  return 1\n", "{\"a\":", "{x}",
         '"\\"', "score: ", "score:", "reason: ", "Verdict: ", "1.", "1a", "a1", ": ",
         "* ", "/10 ", "/"]
SUFFIXES = ["", "x", "`", "```", "}", "]", '"', "1", "</tool_call>", "</answer>", "</think>",
            "\n", "a1", ":"]


def _swallow(f: Callable, *errors) -> Callable[[str], None]:
  def run(text: str) -> None:
    try:
      f(text)
    except errors:
      pass
  return run


_B = as_bucket(("location", "text-only"))
_ALIGN, _NOGT, _LLM, _SKILL = (AlignJudge(None), NoGtJudge(None), LlmJudge(None),
                               SkillJudge(None))
_CHOICES = {"A": "correct", "B": "incorrect", "C": "not_attempted"}

PARSERS: dict[str, Callable[[str], None]] = {
    "plan": _swallow(lambda t: parse_plan(t, max_nodes=10**4), GraphError),
    "jsonsafe": _swallow(jsonsafe.loads, ValueError),
    "skills": _swallow(skills.extract_json_object, MemoryBankError),
    "skill_reply": _swallow(lambda t: skills.parse_reply(t, _B, {"1": 1}, has_skill=True),
                            MemoryBankError),
    "distiller_reward": lambda t: rewards.distiller_reward(t, None),
    "executor_checks": rewards.executor_checks,
    "planner_format": lambda t: rewards.planner_format(t, t, t),
    "judge_grade": rewards.judge_grade,
    "find_number": replies.find_number,
    "find_reason": replies.find_reason,
    "find_verdict": lambda t: replies.find_verdict(t, _CHOICES),
    "judges": lambda t: (_ALIGN.parse(t), _NOGT.parse_evaluator(t), _NOGT.parse_verdict(t),
                         _LLM.parse(t), _SKILL.parse(t)),
    "tool_turn": lambda t: parse_turn(t, tools=("search", "web_image_to_image_search")),
    "tool_call": parse_tool_call,
    "decision": parse_decision,
    "after_think": lambda t: (after_think(t), replies.strip_think(t)),
    "category": parse_category,
    "answer_norm": normalize_answer,
    "extract_code": verifier.extract_code,
    "extract_code_entry": lambda t: verifier.extract_code(t, "f"),
    "unfenced_code": lambda t: verifier.unfenced_code(t, "f"),
    "code_check": verifier.CodeCheck(allow_unfenced=True),
    "srdd_comments": srdd.strip_comments,
    "srdd_complete": srdd._complete,
    "rule_workflow": lambda t: rule_workflow([t]),
}


def probe_input(size: int) -> str:
  """The probe's input: three backticks, then spaces."""
  return "```" + " " * (size - 3)


def build(prefix: str, unit: str, suffix: str, size: int) -> str:
  k = max(1, (size - len(prefix) - len(suffix)) // len(unit))
  return prefix + unit * k + suffix


def seconds(f: Callable[[str], None], text: str, repeat: int = 1) -> float:
  """The best of `repeat` timings in CPU seconds of this process (wall time on a shared machine
  also counts the waits for a CPU, more of them the longer a call runs: 5-40x at 100 KB under
  load), the garbage collector off (its passes are not the parser's) and the judges' cache of
  parsed replies emptied (a repeat would time a lookup)."""
  best = float("inf")
  gc.disable()
  try:
    for _ in range(repeat):
      replies.clear_cache()
      t = time.process_time()
      f(text)
      best = min(best, time.process_time() - t)
  finally:
    gc.enable()
  return best


def fuzz(name: str, candidates: int, screen: int, sizes: list[int], keep: int,
         seed: int) -> dict:
  """The slowest inputs found for one parser, each timed at every size."""
  f, rng = PARSERS[name], random.Random(f"{seed}:{name}")
  triples = {(rng.choice(PREFIXES), rng.choice(UNITS) + rng.choice(["", "", rng.choice(UNITS)]),
              rng.choice(SUFFIXES)) for _ in range(candidates)}
  screened = sorted(((seconds(f, build(*t, screen)), t) for t in sorted(triples)), reverse=True)
  found = []
  for t_screen, triple in screened[:keep]:
    times = [seconds(f, build(*triple, n), repeat=3) for n in sizes]
    found.append({"prefix": triple[0], "unit": triple[1], "suffix": triple[2],
                  "screen_s": t_screen, **_per_kb(sizes, times)})
  probe = [seconds(f, probe_input(n), repeat=3) for n in sizes]
  return {"worst": found, "probe": _per_kb(sizes, probe)}


def _per_kb(sizes: list[int], times: list[float]) -> dict:
  return {"seconds": dict(zip(map(str, sizes), times)),
          "s_per_kb": {str(n): t / (n / 1000) for n, t in zip(sizes, times)},
          "growth": times[-1] / max(times[0], 1e-9)}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--parsers", default=",".join(PARSERS))
  p.add_argument("--candidates", type=int, default=120)
  p.add_argument("--screen", type=int, default=8000)
  p.add_argument("--sizes", default="10000,100000")
  p.add_argument("--keep", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  logging.disable(logging.WARNING)  # judges log every counted failure
  gc.collect()
  gc.freeze()  # what is alive now is never garbage: later collections skip it
  sizes = [int(s) for s in args.sizes.split(",")]
  report = {}
  for name in args.parsers.split(","):
    report[name] = fuzz(name, args.candidates, args.screen, sizes, args.keep, args.seed)
    _print(name, report[name], sizes)
  if args.out:
    with open(args.out, "w") as out:
      json.dump({"sizes": sizes, "candidates": args.candidates, "screen": args.screen,
                 "seed": args.seed, "parsers": report}, out, indent=1)
  return report


def _print(name: str, result: dict, sizes: list[int]) -> None:
  rows = [("probe", result["probe"])] + [
      (repr(w["prefix"] + w["unit"] + "*k" + w["suffix"])[:40], w) for w in result["worst"]]
  for label, r in rows:
    per_kb = "  ".join(f"{r['s_per_kb'][str(n)]:.2e} s/KB @{n // 1000}KB" for n in sizes)
    print(f"{name:20s} {label:42s} {per_kb}  x{r['growth']:.1f}", flush=True)


if __name__ == "__main__":
  main()
