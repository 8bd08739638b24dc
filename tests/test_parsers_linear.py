"""Parsers of model text in linear time: the slow inputs a probe and `benchmarks.parser_fuzz`
found, kept as regression inputs, and the linear rewrites checked against the regexes they
replace on many small random texts (same matches, so the same behaviour).

The time check is a ratio, not an absolute time: t(100 KB) / t(10 KB) must stay well under the
100x of a quadratic parser (linear: about 10x). Times are CPU seconds of this process
(`parser_fuzz.seconds`): wall time on a busy machine also counts the waits for a CPU, which
grow with the call's length (5-40x at 100 KB with the load of a shared CI runner). The quadratic
parsers these inputs came from took 2.6-5.2 s on the probe's 24 KB input, and 100-560x per 10x
of size.
"""

from __future__ import annotations

import logging
import random
import re

import pytest

from apex_jax.judges import align, replies
from apex_jax.memory import skills
from apex_jax.training import rewards
from benchmarks.parser_fuzz import PARSERS, build, probe_input, seconds
from morse_jax import textscan
from morse_jax.execution import verifier
from morse_jax.mas import planner
from morse_jax.tasks import srdd

SMALL, LARGE = 10_000, 100_000
RATIO = 30.0

# (parser, prefix, unit, suffix): `prefix + unit * k + suffix`; unit None: the probe's input
FAST = [
    ("plan", "", None, ""), ("skills", "", None, ""), ("find_number", "", None, ""),
    ("find_verdict", "", None, ""), ("extract_code", "", None, ""),
    ("executor_checks", "", "<answer>", "```"), ("executor_checks", "", "<tool_call>{", ""),
    ("judge_grade", "", "<think>", ""), ("find_number", "Score: ", "\t", "</tool_call>"),
    ("find_number", '{"score": "1', " ", 'x"}'), ("find_reason", "reason:", " ", ""),
    ("judges", "", "1", "a1"), ("extract_code", "```json", "<think>", "`"),
    ("extract_code", "```", " ", "`"), ("unfenced_code", "final def f():\n", "def f():\n", "a1"),
    ("unfenced_code", "def f():\n  return 1\n", "def f():\n", ""),
    ("srdd_comments", "final ", "\n", "</answer>"), ("srdd_complete", "[", "\n\n", "`"),
    ("srdd_complete", "", " ", "pass"), ("plan", "", "```\\```\n", "\n"),
    ("tool_call", "1", "{x}", "]"), ("extract_code_entry", "", "1\n\n", "]"),
    ("code_check", "{\n", "```\n", "</tool_call>"), ("jsonsafe", " ", "[", "1"),
    ("tool_turn", "```json<answer>", "1", "\n"), ("after_think", "", "<think>", ""),
    ("planner_format", "", "<think>", ""), ("answer_norm", "", "a ", "the"),
    ("rule_workflow", "", '"query_list": [', ""), ("rule_workflow", "", "<answer>", ""),
]
# linear but heavy per character (a decode per brace): seconds at 100 KB on a busy machine
SLOW = [
    ("skill_reply", "", None, ""), ("distiller_reward", "", None, ""), ("judges", "", None, ""),
    ("skill_reply", "", "{{x}", "```"), ("distiller_reward", "", "```{", "]"),
    ("decision", "[", "{", "a1"), ("find_verdict", "<tool_call>", "{{", "x"),
    ("judges", "", "```", "</tool_call>"), ("category", "reason:", "/", '"'),
]


def _text(case, size: int) -> str:
  _, prefix, unit, suffix = case
  return probe_input(size) if unit is None else build(prefix, unit, suffix, size)


@pytest.fixture(autouse=True)
def _quiet():
  """Judges log every counted failure; the warnings would be timed with the parser."""
  logging.disable(logging.WARNING)
  yield
  logging.disable(logging.NOTSET)


def _check_linear(case):
  f = PARSERS[case[0]]
  small, large = _text(case, SMALL), _text(case, LARGE)
  f(small)  # warm up
  t_small, t_large = (min(seconds(f, x) for _ in range(3)) for x in (small, large))
  assert t_large < RATIO * t_small, (
      f"{case}: {t_small * 1e3:.2f} ms at {SMALL}, {t_large * 1e3:.2f} ms at {LARGE} "
      f"characters (CPU time): not linear")


@pytest.mark.parametrize("case", FAST, ids=lambda c: f"{c[0]}:{c[1]}{c[2]}*k{c[3]}")
def test_parser_time_is_linear(case):
  _check_linear(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=lambda c: f"{c[0]}:{c[1]}{c[2]}*k{c[3]}")
def test_heavy_parser_time_is_linear(case):
  _check_linear(case)


def test_every_parser_has_a_regression_input():
  assert {case[0] for case in FAST + SLOW} == set(PARSERS)


# ------------------------------------------------- the rewrites match the regexes they replace

def _texts(tokens: list[str], n: int = 3000, seed: int = 0, longest: int = 14) -> list[str]:
  rng = random.Random(seed)
  return [""] + ["".join(rng.choice(tokens) for _ in range(rng.randint(1, longest)))
                 for _ in range(n)]


FENCE_TOKENS = ["```", "`", "``", "json", "JSON", "py", " ", "\t", "\n", "x", "{", "}", "\r"]


def test_fenced_matches_the_plan_and_skill_regexes():
  plan_re = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL)
  skill_re = re.compile(r"```([A-Za-z]*)[ \t]*\n?(.*?)```", re.DOTALL)
  for text in _texts(FENCE_TOKENS):
    assert [b for _, b in textscan.fenced(text, planner._FENCE_HEAD)] == plan_re.findall(text), \
        repr(text)
    assert [(m[1], b) for m, b in textscan.fenced(text, skills._FENCE_HEAD)] == \
        skill_re.findall(text), repr(text)


def test_between_and_tool_call_payloads_match_the_regexes():
  tokens = ["<answer>", "</answer>", "<tool_call>", "</tool_call>", "{", "}", " ", "\n", "x",
            "<", ">"]
  answer_re = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
  call_re = re.compile(r"<tool_call>\s*({.*?})\s*</tool_call>", re.DOTALL)
  for text in _texts(tokens):
    assert textscan.between(text, "<answer>", "</answer>") == answer_re.findall(text), repr(text)
    assert rewards._tool_call_payloads(text) == call_re.findall(text), repr(text)


def test_first_in_line_matches_the_regex():
  tokens = ['"query_list": [', "]", "[", "\n", " ", "x", '"', "<answer>"]
  query_re = re.compile(r'"query_list": \[(.*?)\]')
  for text in _texts(tokens):
    want = query_re.search(text)
    assert textscan.first_in_line(text, '"query_list": [', "]") == (
        want.group(1) if want else None), repr(text)


def test_without_think_matches_the_regex():
  tokens = ["<think>", "</think>", "<THINK>", "</Think>", "<thi", "nk>", "<", "/", "A", " ", "\n"]
  for text in _texts(tokens):
    want = re.sub(r"<think>.*?</think>|<think>|</think>", "", text, flags=re.DOTALL | re.I)
    assert rewards._without_think(text) == want, repr(text)


def test_open_fence_matches_the_regex():
  old = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,})[ \t]*(?P<lang>[^`\s]*)[^`]*$")
  for line in _texts(["`", "```", " ", "\t", "python", "x", "\u00a0", "~"], longest=8):
    new, want = verifier._open_fence(line), old.match(line)
    assert (new is None) == (want is None), repr(line)
    if want:
      assert [new[g] for g in ("indent", "fence", "lang")] == \
          [want[g] for g in ("indent", "fence", "lang")], repr(line)


def test_srdd_line_scans_match_the_regexes():
  tokens = ["#", " ", "\t", "\n", "\r", "\x0c", "\u00a0", "x", "pass", "TODO", "# c", "\n\n"]
  for code in _texts(tokens):
    assert srdd._without_comment_lines(code) == re.sub(r"(?m)^\s*#.*$\n?", "", code), repr(code)
    want = bool(re.search(r"(?m)^\s*pass\s*(#.*)?$|\bTODO\b", code))
    assert bool(srdd._has_pass_line(code) or re.search(r"\bTODO\b", code)) == want, repr(code)


def test_standalone_numbers_match_the_regex():
  tokens = ["1", "7", "0", ".", "a", "_", " ", "-", "/", "x", "²", "١", "\n"]
  old = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]*\d)")
  for text in _texts(tokens):
    assert align._standalone_numbers(text) == old.findall(text), repr(text)


def test_possessive_reply_patterns_match_the_regexes():
  number = replies._NUMBER
  old_label = re.compile(rf"score\**\s*[:=]\s*\**\s*({number})", re.I)
  old_reason = re.compile(r"reason\**\s*:\s*\**\s*(.+)", re.IGNORECASE | re.DOTALL)
  old_json = re.compile(rf"\s*{number}\s*(?:/\s*10)?\s*")
  tokens = ["score", "Score", "reason", "*", " ", "\n", ":", "=", "7", "-", ".", "5", "/", "10",
            "x"]
  group = lambda m: m and m.group(m.re.groups and 1)
  for text in _texts(tokens):
    assert group(replies._labelled_number("score").search(text)) == group(old_label.search(text))
    want = old_reason.search(text)  # (no braces here: find_reason reads the text, not JSON)
    assert replies.find_reason(text) == (want.group(1).strip() if want else ""), repr(text)
    assert bool(replies._JSON_NUMBER.fullmatch(text)) == bool(old_json.fullmatch(text)), \
        repr(text)


def test_unfenced_code_tries_at_most_max_dropped_statements():
  """The run's trailing statements are dropped one at a time, up to MAX_DROPPED, to find a
  definition that compiles; the name must appear in what is kept."""
  real = "def add(a, b):\n  return a + b\n"
  broken = "def g():\n"  # a body-less def: the run does not compile with it
  assert verifier.unfenced_code(real + broken * verifier.MAX_DROPPED, "add") == real
  assert verifier.unfenced_code(real + broken * (verifier.MAX_DROPPED + 1), "add") is None
  assert verifier.unfenced_code("def ａdd(a, b):\n  return a + b\n" + broken, "add") == \
      "def ａdd(a, b):\n  return a + b\n"  # NFKC: Python reads ａdd as add
