"""Every APEx reward on numbers worked out by hand from the authors' rules."""

import json

import pytest

from apex_jax.training import rewards as rw

SEARCH = ('<tool_call>{"name": "search", "arguments": {"query_list": ["capital of France"]}}'
          '</tool_call>')


def call(name, arguments):
  return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize("text, acc, tool, fmt, total", [
    # searched, answered: 0.7 + 0.2 + 0.1
    (f"<think>a</think>{SEARCH}<think>b</think><answer>Paris</answer>", 1.0, 1.0, 1.0, 1.0),
    # no tool call: 0.1
    ("<think>a</think><answer>Paris</answer>", 0.0, 0.0, 1.0, 0.1),
    # search with bad arguments: not a valid call, so neither tool nor format: 0.7
    (f"<think>a</think>{call('search', {'q': 'x'})}<answer>Paris</answer>", 1.0, 0.0, 0.0, 0.7),
    (f"<think>a</think>{call('search', {'query_list': []})}<answer>P</answer>", 1.0, 0.0, 0.0,
     0.7),
    (f"<think>a</think>{call('search', 'capital')}<answer>P</answer>", 0.0, 0.0, 0.0, 0.0),
    (f"<think>a</think>{call('web_image_to_image_search', {'img_idx': 1})}<answer>P</answer>",
     0.0, 0.0, 0.0, 0.0),
    # a bad call, then a valid one in the same segment: the valid one counts (0.2 + 0.1 * 0)
    (f"<think>a</think>{call('search', {'q': 'x'})}{SEARCH}<answer>P</answer>", 0.0, 1.0, 0.0,
     0.2),
    # two plan segments, a search only in the first: tool 1/2 -> 0.35 + 0.1 + 0.1
    (f"{SEARCH}<think>a</think>{rw.REPLAN_MARKER}<think>b</think><answer>x</answer>", 0.5, 0.5,
     1.0, 0.55),
    # unbalanced think
    (f"<think>a{SEARCH}<answer>Paris</answer>", 1.0, 1.0, 0.0, 0.9),
    # unknown tool: not a use, and a format error
    (f"<think>a</think>{call('calc', {'x': 1})}<answer>4</answer>", 0.0, 0.0, 0.0, 0.0),
    # no answer, or an empty one
    (f"<think>a</think>{SEARCH}", 0.0, 1.0, 0.0, 0.2),
    ("<think>a</think><answer> </answer>", 0.0, 0.0, 0.0, 0.0),
    # broken JSON in a tool call
    ("<think>a</think><tool_call>{not json}</tool_call><answer>x</answer>", 0.0, 0.0, 0.0, 0.0),
    # image search twice: the second is illegal
    (call("web_image_to_image_search", {"img_idx": "0"}) * 2 + "<answer>x</answer>", 0.0, 1.0,
     0.0, 0.2),
])
def test_executor_reward(text, acc, tool, fmt, total):
  r = rw.executor_reward(text, acc)
  assert r.parts == {"acc": acc, "tool": tool, "format": fmt}
  assert r.total == pytest.approx(total)


@pytest.mark.parametrize("kwargs, parts, total", [
    # y1 right, kept: acc(y2) = acc(y1): 0.7 + 0.2 + 0.05 + 0.05
    (dict(plan="p", decision="<think>fine</think>no", y1_correct=True, y2_correct=None),
     (1, 1, 1, 1), 1.0),
    # y1 wrong, replanned, y2 right: 0.7 + 0.05 + 0.05
    (dict(plan="p", decision="Yes", y1_correct=False, y2_correct=True, replan="q"),
     (1, 0, 1, 1), 0.8),
    # y1 wrong but kept: only the format
    (dict(plan="p", decision="no", y1_correct=False, y2_correct=None), (0, 0, 1, 0), 0.05),
    # 'Yes.' is not exactly yes/no (format 0), and it replanned a right answer (decision 0)
    (dict(plan="p", decision="Yes.", y1_correct=True, y2_correct=True, replan="q"),
     (1, 1, 0, 0), 0.9),
    # the authors' substring test: 'not' contains 'no'
    (dict(plan="p", decision="I do not know", y1_correct=True, y2_correct=None), (1, 1, 0, 1),
     0.95),
    # an unclosed think in the replan breaks the format
    (dict(plan="p", decision="yes", y1_correct=False, y2_correct=False, replan="<think>q"),
     (0, 0, 0, 1), 0.05),
])
def test_planner_reward(kwargs, parts, total):
  r = rw.planner_reward(**kwargs)
  assert tuple(r.parts.values()) == parts
  assert r.total == pytest.approx(total)


def skill(actions, **extra):
  doc = {"skill_name": "dates", "category": "time", "modality": "text-only",
         "description": "find dates", "procedure": [
             {"step": i + 1, "action": a, "purpose": "p"} for i, a in enumerate(actions)],
         "pitfalls": ["time zones"], "win_rate": 0.5, "version": 1, "evidence_count": 3}
  return {**doc, **extra}


def reply(op, actions=("a", "b"), **extra):
  return "<think>x</think>" + json.dumps({"operation": op, "skill": skill(actions, **extra)})


CURRENT = skill(["a", "b", "c", "d"])


@pytest.mark.parametrize("text, current, quality, parts, total", [
    # a complete synthesis of a new bucket, rule quality 1: 0.5 + 0.1 + 0.4
    (reply("synthesize"), None, None, (1.0, 1.0, 1.0), 1.0),
    (reply("synthesize"), None, 0.5, (0.5, 1.0, 1.0), 0.75),
    # anything but synthesize on an empty bucket: 0.3
    (reply("refine"), None, 1.0, (1.0, 1.0, 0.3), 0.72),
    # refine changing 1 of 4 actions (0.25): 0.9; 3 of 4: 0.4; none: 0.7
    (reply("refine", ("a", "b", "c", "e")), CURRENT, 1.0, (1.0, 1.0, 0.9), 0.96),
    (reply("refine", ("a",)), CURRENT, 1.0, (1.0, 1.0, 0.4), 0.76),
    (reply("refine", ("a", "b", "c", "d")), CURRENT, 1.0, (1.0, 1.0, 0.7), 0.88),
    (reply("create"), CURRENT, 0.0, (0.0, 1.0, 0.7), 0.38),
    (reply("skip", ("a", "b", "c", "d")), CURRENT, 0.0, (0.0, 1.0, 0.9), 0.46),
    (reply("skip"), CURRENT, 0.0, (0.0, 1.0, 0.4), 0.26),
    # unknown operation: format 0.5 + 0.25, rationality 0.2
    (reply("merge"), CURRENT, 0.0, (0.0, 0.75, 0.2), 0.155),
    # no JSON at all: nothing, whatever the judge said
    ("I would refine it.", CURRENT, 1.0, (0.0, 0.0, 0.0), 0.0),
])
def test_distiller_reward(text, current, quality, parts, total):
  r = rw.distiller_reward(text, current, quality)
  assert tuple(r.parts.values()) == pytest.approx(parts)
  assert r.total == pytest.approx(total)


def test_skill_quality_rules_partial():
  # 4/9 fields * 0.3 + 1/2 good steps * 0.3; no pitfalls; win rate out of range; bool count
  doc = {"skill": {"skill_name": "x", "win_rate": 2, "evidence_count": True, "procedure": [
      {"step": 1, "action": "a"}, {"step": 2, "action": "b", "purpose": "c"}]}}
  assert rw.skill_quality_rules(doc) == pytest.approx(4 / 9 * 0.3 + 0.15)
  assert rw.skill_quality_rules({"skill": "text"}) == 0.0


@pytest.mark.parametrize("text, grade", [("A", 1.0), ("<think>hmm</think> B", 0.5), ("C", 0.0),
                                         ("D", None), ("A, clearly", None), (None, None)])
def test_judge_grade(text, grade):
  assert rw.judge_grade(text) == grade


@pytest.mark.parametrize("evidence, lam", [(0, 0.0), (5, 0.04), (10, 0.08), (20, 0.08)])
def test_skill_lambda(evidence, lam):
  assert rw.skill_lambda(0.8, evidence) == pytest.approx(lam)


def test_ttrl_reward():
  # R_nogt = 0.9 + 0.1 = 1; R = 0.92 * 1 + 0.08 * 0.5
  r = rw.ttrl_reward(1.0, 1.0, alignment=0.5, lam=0.08)
  assert r.total == pytest.approx(0.96) and r.parts["nogt"] == pytest.approx(1.0)
  # R_nogt = 0.1; R = 0.9 * 0.1 + 0.1 * 1
  assert rw.ttrl_reward(0.0, 1.0, alignment=1.0, lam=0.1).total == pytest.approx(0.19)
  # no skill guidance: R = R_nogt = 0.9 * 0.5 + 0
  assert rw.ttrl_reward(0.5, 0.0).total == pytest.approx(0.45)


def test_skill_gate():
  assert rw.skill_gate(0.99, 20, True)
  assert not rw.skill_gate(0.97, 20, True)
  assert not rw.skill_gate(0.99, 19, True)
  assert not rw.skill_gate(0.99, 20, False)
  assert rw.skill_gate(0.99, 20, False, require_procedure=False)


@pytest.mark.parametrize("call_, field", [
    (lambda: rw.executor_reward("x", 1.5), "executor accuracy"),
    (lambda: rw.planner_reward(plan="", decision="", y1_correct=None, y2_correct=None),
     "planner y1_correct"),
    (lambda: rw.ttrl_reward(float("nan"), 1.0), "TTRL arbiter"),
    (lambda: rw.skill_lambda(0.5, -1), "skill evidence"),
    (lambda: rw.distiller_reward(reply("create"), None, 2.0), "distiller quality"),
])
def test_bad_inputs_name_the_field(call_, field):
  with pytest.raises(ValueError, match=field):
    call_()
