"""Property tests of every parser of model output: on seeded hostile inputs
(tests/hostile.py: truncated and deeply nested JSON, huge numbers, NaN / Infinity, duplicate
keys, cycles, 10^4-node chains, odd unicode) each ends in a value or its documented error, in
time linear in the input's length, and NaN / inf never become a score.

The default run checks N_FAST inputs per parser (a few seconds); `-m slow` checks N_SLOW, the
size of the probe that found the crashes.
"""

from __future__ import annotations

import gc
import logging
import math
import time

import pytest

from apex_jax.judges.align import AlignJudge
from apex_jax.judges.nogt import NoGtConfig, NoGtJudge
from apex_jax.judges.replies import find_number, find_verdict
from apex_jax.memory import MemoryBank, MemoryConfig
from apex_jax.memory.schema import as_bucket
from apex_jax.memory.skills import DistillerError, extract_json_object, parse_reply
from apex_jax.tools.protocol import Answer, FormatError, ToolCall, parse_turn
from morse_jax.mas.graph import GraphError, SubtaskGraph
from morse_jax.mas.planner import parse_plan
from tests import hostile
from tests.apex.memory.fakes import HashEmbedder

N_FAST, N_SLOW = 300, 3035
CAP_S = 1.0  # per input, plus 10 us per character: generous (most take well under 50 ms)
B = ("location", "text-only")


@pytest.fixture(autouse=True)
def _quiet():
  """Judges log every counted failure; thousands of warnings would dominate the run time."""
  logging.disable(logging.WARNING)
  yield
  logging.disable(logging.NOTSET)


def _turn(text):
  out = parse_turn(text, tools=("search", "web_image_to_image_search"))
  assert isinstance(out, (ToolCall, Answer, FormatError))
  if isinstance(out, Answer):
    assert "<answer>" not in out.text and "</answer>" not in out.text


def _plan(text):
  try:
    graph = parse_plan(text, max_nodes=10**4)
  except GraphError:
    return
  assert graph.topological_order() and graph.waves()


def _graph(obj):
  try:
    graph = (SubtaskGraph.from_json(obj, max_nodes=10**5) if isinstance(obj, str)
             else SubtaskGraph.from_obj(obj, max_nodes=10**5))
  except GraphError:
    return
  order = graph.topological_order()
  assert sorted(order) == sorted(n.id for n in graph.nodes)


def _skill(text):
  try:
    obj = extract_json_object(text)
  except DistillerError:
    obj = None
  assert obj is None or isinstance(obj, dict)
  try:
    parse_reply(text, as_bucket(B), {"1": 1, "2": 2}, has_skill=True)
  except DistillerError:
    pass


_ALIGN, _NOGT = AlignJudge(None), NoGtJudge(None)
_NOGT_CLIP = NoGtJudge(None, NoGtConfig(out_of_range="clip"))


def _judge(text):
  score, how = find_number(text)
  assert score is None or math.isfinite(score), (score, how)
  verdict, _ = find_verdict(text, {"A": "correct", "B": "incorrect"})
  assert verdict in (None, "correct", "incorrect")
  a = _ALIGN.parse(text)
  assert math.isfinite(a.score) and 0.0 <= a.score <= 1.0, a
  for judge in (_NOGT, _NOGT_CLIP):
    e = judge.parse_evaluator(text)
    assert math.isfinite(e.score) and 1.0 <= e.score <= 10.0, e
    assert judge.parse_verdict(text)[0] in (None, "correct", "incorrect")


def graph_inputs(n: int, seed: int = 0) -> list:
  """Plan JSON texts (mutated), plus every 50th a 10^4-node chain, a cycle through all of it, or
  a node depending on itself."""
  out: list = []
  for i, text in enumerate(hostile.texts("plan", n, seed)):
    if i % 50 == 1:
      out.append(hostile.chain(10**4, cycle=bool(i % 100 == 1)))
    elif i % 50 == 2:
      out.append([{"id": "a", "title": "t", "description": "d", "depends_on": ["a"]}])
    else:
      body = text.split("```json\n", 1)[-1].split("\n```", 1)[0]
      out.append(body)
  return out


PARSERS = {  # name -> (check one input, inputs)
    "tool calls": (_turn, lambda n: hostile.texts("turn", n)),
    "plans": (_plan, lambda n: hostile.texts("plan", n)),
    "graphs": (_graph, graph_inputs),
    "skills": (_skill, lambda n: hostile.texts("skill", n)),
    "judges": (_judge, lambda n: hostile.texts("score", n // 2) + hostile.texts("verdict",
                                                                                 n - n // 2)),
}


def _check_all(name: str, n: int):
  check, inputs = PARSERS[name]
  xs = inputs(n)
  gc.freeze()  # the inputs (chains of 10^4 nodes) are not garbage: GC passes over them would
  try:         # be timed as the parser's
    _check_each(name, check, xs)
  finally:
    gc.unfreeze()


def _check_each(name, check, xs):
  slowest = (0.0, 0.0, -1)
  for i, x in enumerate(xs):
    t = time.process_time()  # CPU seconds: see _seconds
    try:
      check(x)
    except Exception as e:  # noqa: BLE001 - the test reports which input failed how
      raise AssertionError(f"{name} input {i} ({str(x)[:80]!r}...): {type(e).__name__}: "
                           f"{str(e)[:200]}") from e
    took = time.process_time() - t
    # a cap linear in the input's size: 1 s, plus 10 us per character (a 100 KB reply read
    # nine times by the judges takes ~0.3 s on a quiet machine)
    slowest = max(slowest, (took / (CAP_S + 1e-5 * len(str(x))), took, i))
  assert slowest[0] < 1, f"{name}: input {slowest[2]} took {slowest[1]:.2f} s"


@pytest.mark.parametrize("name", list(PARSERS))
def test_parser_never_crashes(name):
  _check_all(name, N_FAST)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PARSERS))
def test_parser_never_crashes_full_probe(name):
  _check_all(name, N_SLOW)


def test_distiller_reply_applied_or_rejected(tmp_path):
  """apply_distiller_reply on a real bank: every hostile reply is applied or a counted
  DistillerError, never an exception (a step "²" raised ValueError)."""
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())
  for i in range(3):
    bank.add(f"where is place {i}", f"1. search {i}", True, category="location")
  replies = hostile.texts("skill", 120, seed=1) + [
      '{"operation": "create", "skill": {"description": "d", "procedure": [{"step": "²", '
      '"action": "a", "purpose": "p"}], "pitfalls": []}, "absorbed_ids": []}',
      '{"operation": "create", "skill": {"description": "\\ud800", "procedure": [{"step": 1, '
      '"action": "a", "purpose": "p"}], "pitfalls": ["\\u0000"]}, "absorbed_ids": []}']
  for reply in replies:
    result = bank.apply_distiller_reply(B, reply)
    assert result.applied or isinstance(result.error, DistillerError)
  assert not bank.apply_distiller_reply(B, replies[-2]).applied


def _seconds(f, xs, repeat: int = 5) -> list[float]:
  """The best of `repeat` timings of f on each of xs, measured in turns, in CPU seconds of this
  process (wall time on a busy machine also counts the waits for a CPU, which grow with the
  call's length), with the garbage collector off (its passes are not the parser's)."""
  best = [math.inf] * len(xs)
  gc.collect()
  gc.disable()
  try:
    for _ in range(repeat):
      for i, x in enumerate(xs):
        t = time.process_time()
        f(x)
        best[i] = min(best[i], time.process_time() - t)
  finally:
    gc.enable()
  return best


def _swallow(f, *errors):
  def run(x):
    try:
      f(x)
    except errors:
      pass
  return run


# inputs that make a naive parser super-linear (cubic, quadratic) or hang: time(4n) / time(n)
# must stay < 6, or 4n take under CAP_S (on a busy machine cache and allocation effects alone
# give 6-9x at these sizes)
SCALING = {
    "extract_json_object open braces": (
        _swallow(extract_json_object, DistillerError),
        lambda n: "{" * n + '{"a":1}' * n, 2000),
    "extract_json_object nested broken": (
        _swallow(extract_json_object, DistillerError),
        lambda n: '{"a":' * n + "1,", 2000),
    "extract_json_object many broken": (
        _swallow(extract_json_object, DistillerError), lambda n: "{x}" * n, 5000),
    "find_verdict punctuation run": (
        lambda s: find_verdict(s, {"A": "correct"}), lambda n: "A" + "." * n + "x", 20000),
    "find_number digits": (find_number, lambda n: "score: " + "9" * n + " /10", 20000),
    "parse_turn tags out of order": (
        parse_turn, lambda n: "<think>x</think>" + "</answer>" * n + "<answer>" * n, 5000),
    "parse_plan nested": (_swallow(parse_plan, GraphError), lambda n: "[" * n, 20000),
    "graph chain": (lambda n: SubtaskGraph.from_obj(hostile.chain(n), 10**6).waves(),
                    lambda n: n, 2500),
}


@pytest.mark.parametrize("name", list(SCALING))
def test_parser_time_is_linear(name):
  f, make, n = SCALING[name]
  small, large = make(n), make(4 * n)
  f(small)  # warm up
  t_small, t_large = _seconds(f, [small, large])
  assert t_large < 6 * t_small + 0.02 or t_large < CAP_S, \
      f"{name}: {t_small:.4f} s at n, {t_large:.4f} s at 4n"


def test_ttrl_judging_survives_a_judge_that_raises():
  """TTRL's judge wrapper counts any parse failure as 0 (an OverflowError from a 400-digit
  score once ended the run)."""
  from apex_jax.training.ttrl import _Judging

  class Raising:
    def __init__(self, error):
      self.error = error

    def arbiter(self, question, workflow, answer):
      raise self.error

    def alignment(self, plan, skill):
      return float("nan")

  for error in (OverflowError("int too large to convert to float"), RecursionError("deep"),
                ValueError("x"), ZeroDivisionError("y")):
    judging = _Judging(Raising(error))
    assert judging.arbiter("q", "w", "a") == 0.0
    assert judging.alignment("p", None) == 0.0
    assert judging.failures == {"arbiter_error": 1, "alignment_bad_value": 1}


def test_the_reported_cases():
  """A hostile probe's findings one by one."""
  deep = "[" * 1000
  assert find_number('{"score": ' + "1" * 400 + "}") == (None, "")
  assert find_number("Score: " + "1" * 400) == (None, "")
  assert find_number('{"score": NaN}') == (None, "") and find_number('{"score": 7}') == (7.0,
                                                                                         "json")
  turn = parse_turn("<think>t</think><tool_call>" + deep + "</tool_call>")
  assert isinstance(turn, FormatError) and turn.code == "invalid_json"
  assert "nested deeper than" in turn.message
  nested = parse_turn("<think>t</think><answer><answer>x</answer></answer>")
  assert isinstance(nested, FormatError) and nested.code == "unbalanced_tags"
  assert "<answer> inside <answer>" in nested.message
  with pytest.raises(GraphError, match="nested deeper than"):
    parse_plan(deep + "]" * 1000)
  with pytest.raises(DistillerError):
    extract_json_object("{" + deep)
  step = ('{"operation": "create", "skill": {"description": "d", "procedure": [{"step": "²", '
          '"action": "a", "purpose": "p"}], "pitfalls": []}, "absorbed_ids": []}')
  with pytest.raises(DistillerError, match=r"field 'step' must be an integer; got '²'") as err:
    parse_reply(step, as_bucket(B), {}, has_skill=False)
  assert err.value.kind == "wrong_type"
  t = time.perf_counter()
  with pytest.raises(DistillerError):
    extract_json_object("{" * 800 + '{"a":1}' * 800)  # was 2 s (cubic)
  assert time.perf_counter() - t < 0.5
  assert math.isfinite(_ALIGN.parse('{"score": NaN}').score)
  assert _ALIGN.parse("1" * 400).failure == "no_score"
  for reply in ('{"score": NaN}', "Score: " + "9" * 400, '{"score": Infinity}'):
    e = _NOGT_CLIP.parse_evaluator(reply)
    assert e.failure == "no_score" and e.score == 1.0
  chain = hostile.chain(10**4)
  graph = SubtaskGraph.from_obj(chain, 10**4)
  assert len(graph.waves()) == 10**4 and graph.topological_order()[-1] == str(10**4 - 1)
  with pytest.raises(GraphError, match="dependency cycle"):
    SubtaskGraph.from_obj(hostile.chain(10**4, cycle=True), 10**4)
