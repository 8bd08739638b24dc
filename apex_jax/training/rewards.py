"""APEx rewards: pure functions of texts and judgements, following the authors' reward code.

  executor   R = 0.7 acc + 0.2 tool + 0.1 format
             (J-Ding519/APEx Executor-Train/Train/local_search/mmsearch.py `compute_score`)
  planner    R = 0.7 acc(y2) + 0.2 acc(y1) + 0.05 format + 0.05 decision
             (Planner-Train/mem-plan/local_search/mmsearch.py `compute_score`)
  distiller  R = 0.5 quality + 0.1 format + 0.4 evolution rationality
             (Writer-Train/Train/writer_skill/writer_dataset.py `compute_score`)
  TTRL       R = (1 - l_s) R_nogt + l_s R_align,  R_nogt = 0.9 arbiter + 0.1 format,
             l_s = 0.1 w min(n / 10, 1)   (TTRL/TTRL-nogt/local_search/mmsearch_skill.py)

Every function returns a `Reward`: the total and its named parts (logged as metrics).
Inputs computed by our own code (scores, flags) are checked and raise ValueError naming the field;
model text is never trusted and only lowers the score.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Mapping

from apex_jax.memory.skills import DistillerError, confidence, extract_json_object
from apex_jax.tools.protocol import TOOL_CHECKS, FormatError, parse_tool_call
from morse_jax import textscan

# The executor's context marks a replan with this line (mmsearch.py splits on it).
REPLAN_MARKER = "I have a revised plan for you to follow:\n"
DISTILLER_OPERATIONS = ("synthesize", "refine", "create", "skip")
SKILL_FIELDS = ("skill_name", "category", "modality", "description", "procedure", "pitfalls",
                "win_rate", "version", "evidence_count")
JUDGE_GRADES = {"A": 1.0, "B": 0.5, "C": 0.0}  # the skill judge's letters (writer_dataset.py)


@dataclasses.dataclass(frozen=True)
class Reward:
  total: float
  parts: Mapping[str, float]


def _unit(value: Any, field: str) -> float:
  """A score in [0, 1]; bools count as 0 / 1."""
  if not isinstance(value, (bool, int, float)) or not math.isfinite(value) or \
      not 0.0 <= value <= 1.0:
    raise ValueError(f"{field} must be a number in [0, 1], got {value!r}")
  return float(value)


def _after_think(text: str) -> str:
  """The text after the last <think> or </think> tag (the authors' `extract_after_think`)."""
  cut = max(text.rfind("<think>"), text.rfind("</think>"))
  rest = text if cut < 0 else text[cut + len("</think>"):]
  return rest.replace("<|im_end|>", "").strip()


# ------------------------------------------------------------------------------------ executor


def executor_checks(text: str) -> tuple[float, float]:
  """(tool, format) of the executor's generated text, by mmsearch.py's rules.

  format = 1 unless: <think> tags unbalanced; after the last </think>, <answer> tags unbalanced
  or no non-empty <answer>...</answer>; or a tool call is illegal (not JSON, unknown name, bad
  arguments, web_image_to_image_search more than once).
  tool = mean over plan segments (split at REPLAN_MARKER) of 1[the segment makes a valid tool
  call]: a known tool with arguments that pass its check (`protocol.parse_tool_call`, the same
  check the executor applies to its turns). The paper rewards a valid call; the authors' code
  counts a known name even with bad arguments, which pays a policy for calls that never search.
  """
  if not isinstance(text, str):
    raise ValueError(f"executor text must be a string, got {type(text).__name__}")
  error = text.count("<think>") != text.count("</think>")
  tail = text.split("</think>")[-1].strip()
  error |= tail.count("<answer>") != tail.count("</answer>")
  answers = textscan.between(tail, "<answer>", "</answer>")
  error |= not answers or not answers[-1].strip()
  segments = text.split(REPLAN_MARKER)
  used_segments, image_calls = 0, 0
  for segment in segments:
    used = False
    for payload in _tool_call_payloads(segment):
      call = parse_tool_call(payload, tuple(TOOL_CHECKS))
      if isinstance(call, FormatError):  # not JSON, unknown name, or bad arguments
        error = True
        continue
      if call.name == "web_image_to_image_search":
        image_calls += 1
        if image_calls > 1:
          error = True
          continue
      used = True
    used_segments += used
  return used_segments / len(segments), 0.0 if error else 1.0


_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLANKS = re.compile(r"\s*")


def _tool_call_payloads(segment: str) -> list[str]:
  """`re.findall(r"<tool_call>\\s*({.*?})\\s*</tool_call>", segment, re.DOTALL)` (mmsearch.py's
  pattern) in linear time: the payload runs from the '{' after an opening tag to the first '}'
  followed by blanks and a closing tag. The regex searched to the end again from every opening
  tag when no such '}' followed: quadratic on many openings."""
  out, i = [], 0
  while True:
    start = segment.find(_CALL_OPEN, i)
    if start < 0:
      return out
    brace = _BLANKS.match(segment, start + len(_CALL_OPEN)).end()
    if not segment.startswith("{", brace):
      i = start + 1
      continue
    close = segment.find(_CALL_CLOSE, brace + 1)
    while close >= 0:
      end = close  # back over the blanks before the tag, to the '}' that must end the payload
      while end > brace + 1 and segment[end - 1].isspace():
        end -= 1
      if end > brace + 1 and segment[end - 1] == "}":
        break
      close = segment.find(_CALL_CLOSE, close + 1)
    if close < 0:  # no payload ends after this '{', so none after a later one either
      return out
    out.append(segment[brace:end])
    i = close + len(_CALL_CLOSE)


def executor_reward(text: str, accuracy: float) -> Reward:
  """R = 0.7 acc + 0.2 tool + 0.1 format; acc from the rule judge or an LLM judge."""
  acc = _unit(accuracy, "executor accuracy")
  tool, fmt = executor_checks(text)
  return Reward(0.7 * acc + 0.2 * tool + 0.1 * fmt, {"acc": acc, "tool": tool, "format": fmt})


# ------------------------------------------------------------------------------------- planner


def planner_format(plan: str, decision: str, replan: str | None = None) -> float:
  """1 when the decision (after any think block) is exactly 'yes' or 'no' (case-insensitive)
  and every planner turn (plan, decision, replan) has as many <think> as </think>; else 0."""
  if _after_think(decision).lower() not in ("yes", "no"):
    return 0.0
  turns = [plan, decision] + ([] if replan is None else [replan])
  return float(all(t.count("<think>") == t.count("</think>") for t in turns))


def planner_reward(*, plan: str, decision: str, y1_correct: bool, y2_correct: bool | None,
                   replan: str | None = None) -> Reward:
  """R = 0.7 acc(y2) + 0.2 acc(y1) + 0.05 format + 0.05 decision.

  y2_correct None: no replan happened, and acc(y2) = acc(y1). decision = 1 when y1 was right
  and the decision text contains 'no', or y1 was wrong and it contains 'yes' (substring tests,
  as the authors', so 'No.' counts). An episode that never reached the decision scores 0 in
  the authors' code; the caller gives such episodes reward 0 without calling this.
  """
  acc1 = _unit(y1_correct, "planner y1_correct")
  acc2 = acc1 if y2_correct is None else _unit(y2_correct, "planner y2_correct")
  said = _after_think(decision).lower()
  right = ("no" in said) if acc1 else ("yes" in said)
  fmt, dec = planner_format(plan, decision, replan), float(right)
  return Reward(0.7 * acc2 + 0.2 * acc1 + 0.05 * fmt + 0.05 * dec,
                {"acc_y2": acc2, "acc_y1": acc1, "format": fmt, "decision": dec})


# ----------------------------------------------------------------------------------- distiller


def parse_skill_reply(text: str) -> dict | None:
  """The reply's JSON object, or None. Uses the memory bank's extractor (after </think>, fenced
  or bare), so the reward agrees with what `MemoryBank.apply_distiller_reply` can read; the
  authors' greedy `{...}` regex fails on trailing prose with braces, which this accepts."""
  try:
    return extract_json_object(text)
  except DistillerError:
    return None


def distiller_format(parsed: dict | None) -> float:
  """0 without JSON; else 0.5 + 0.25 [operation is valid] + 0.25 ['skill' present]."""
  if parsed is None:
    return 0.0
  return 0.5 + 0.25 * (parsed.get("operation") in DISTILLER_OPERATIONS) + 0.25 * ("skill" in parsed)


def skill_quality_rules(parsed: dict | None) -> float:
  """The authors' rule-based quality (used when the LLM judge fails):
  0.3 |fields present| / 9 + 0.3 (steps with step, action, purpose) / steps
  + 0.2 [pitfalls non-empty] + 0.1 [0 <= win_rate <= 1] + 0.1 [evidence_count int > 0].
  A JSON true is not a number here (Python's bool is an int; the authors' check lets it pass)."""
  skill = None if parsed is None else parsed.get("skill")
  if not isinstance(skill, dict):
    return 0.0
  score = 0.3 * len(set(skill) & set(SKILL_FIELDS)) / len(SKILL_FIELDS)
  steps = skill.get("procedure", [])
  if isinstance(steps, list) and steps:
    good = sum(isinstance(s, dict) and {"step", "action", "purpose"} <= set(s) for s in steps)
    score += 0.3 * good / len(steps)
  pitfalls = skill.get("pitfalls", [])
  score += 0.2 * (isinstance(pitfalls, list) and bool(pitfalls))
  rate = skill.get("win_rate")
  score += 0.1 * (isinstance(rate, (int, float)) and not isinstance(rate, bool) and
                  0.0 <= rate <= 1.0)
  count = skill.get("evidence_count")
  score += 0.1 * (isinstance(count, int) and not isinstance(count, bool) and count > 0)
  return score


def _actions(skill: Any) -> set:
  steps = skill.get("procedure", []) if isinstance(skill, dict) else []
  steps = steps if isinstance(steps, list) else []
  return {s.get("action", "") for s in steps if isinstance(s, dict)}


def evolution_rationality(parsed: dict | None, current_skill: Mapping | None) -> float:
  """Whether the operation fits the bucket's state (writer_dataset.py
  `_score_evolution_rationality`):

    no reply 0; no current skill: synthesize 1, else 0.3;
    refine: changed = 1 - |old actions & new actions| / |old actions|:
            0.9 if 0.1 <= changed <= 0.5, 0.4 if > 0.5, 0.7 if < 0.1; 0.5 when either is empty;
            0.2 when 'skill' is not an object;
    create 0.7; skip: 0.9 if the procedure is unchanged, else 0.4 (0.5 without a skill object);
    anything else 0.2.
  """
  if parsed is None:
    return 0.0
  op, skill = parsed.get("operation", ""), parsed.get("skill", {})
  if current_skill is None:
    return 1.0 if op == "synthesize" else 0.3
  if op == "refine":
    if not isinstance(skill, dict):
      return 0.2
    old, new = _actions(current_skill), _actions(skill)
    if not old or not new:
      return 0.5
    changed = 1.0 - len(old & new) / len(old)
    return 0.9 if 0.1 <= changed <= 0.5 else (0.4 if changed > 0.5 else 0.7)
  if op == "create":
    return 0.7
  if op == "skip":
    if not isinstance(skill, dict):
      return 0.5
    same = json.dumps(current_skill.get("procedure", []), sort_keys=True) == json.dumps(
        skill.get("procedure", []), sort_keys=True)
    return 0.9 if same else 0.4
  return 0.2


def judge_grade(reply: str) -> float | None:
  """The skill judge's letter (think blocks removed) as 1 / 0.5 / 0; None when it is not A/B/C.
  The authors score an unreadable letter 0; only a failed call falls back to the rules."""
  if not isinstance(reply, str):
    return None
  cleaned = _without_think(reply).strip()
  return JUDGE_GRADES.get(cleaned)


_THINK_OPEN, _THINK_CLOSE = re.compile("<think>", re.I), re.compile("</think>", re.I)
_THINK_TAG = re.compile("</?think>", re.I)


def _without_think(reply: str) -> str:
  """`re.sub(r"<think>.*?</think>|<think>|</think>", "", reply, flags=re.DOTALL | re.I)` in
  linear time: think blocks removed, then the tags left outside them (a stray closing tag, an
  opening one never closed). Each gap is cleaned apart: joined first, its ends could form a
  tag the regex never saw."""
  pieces, i = [], 0
  for opening, closing in textscan.tag_spans(reply, _THINK_OPEN, _THINK_CLOSE):
    pieces.append(_THINK_TAG.sub("", reply[i:opening.start()]))
    i = closing.end()
  pieces.append(_THINK_TAG.sub("", reply[i:]))
  return "".join(pieces)


def distiller_reward(text: str, current_skill: Mapping | None,
                     quality: float | None = None, *, format_grade: float | None = None,
                     evolution_grade: float | None = None) -> Reward:
  """R = 0.5 quality + 0.1 format + 0.4 evolution rationality.

  quality: the skill judge's grade (`judge_grade`), None when the judge call failed (then the
  rule-based `skill_quality_rules`, as the authors fall back). format_grade / evolution_grade:
  a judge's grade of that term (the paper's J_skill), None: the rule (`distiller_format`,
  `evolution_rationality`; the authors'). A reply without JSON gets 0 on every term whatever
  a judge said. current_skill: the bucket's skill as `Skill.to_dict()`.
  """
  parsed = parse_skill_reply(text)
  if parsed is None:
    q = 0.0
  else:
    q = skill_quality_rules(parsed) if quality is None else _unit(quality, "distiller quality")
  fmt, evo = distiller_format(parsed), evolution_rationality(parsed, current_skill)
  if parsed is not None and format_grade is not None:
    fmt = _unit(format_grade, "distiller format")
  if parsed is not None and evolution_grade is not None:
    evo = _unit(evolution_grade, "distiller evolution")
  return Reward(0.5 * q + 0.1 * fmt + 0.4 * evo, {"quality": q, "format": fmt, "evolution": evo})


# ---------------------------------------------------------------------------------------- TTRL


def skill_lambda(win_rate: float, evidence: int, base: float = 0.1, n_full: int = 10) -> float:
  """l_s = base * w * min(n / N, 1) (`adaptive_lambda` of the skill's confidence)."""
  _unit(win_rate, "skill win_rate")
  if isinstance(evidence, bool) or not isinstance(evidence, int) or evidence < 0:
    raise ValueError(f"skill evidence must be an int >= 0, got {evidence!r}")
  return base * confidence(win_rate, evidence, n_full)


def ttrl_reward(arbiter: float, format_score: float, *, alignment: float | None = None,
                lam: float = 0.0) -> Reward:
  """R = (1 - l_s) R_nogt + l_s R_align with R_nogt = 0.9 arbiter + 0.1 format.

  alignment None: the bucket has no skill with a procedure or pitfalls, and R = R_nogt.
  """
  nogt = 0.9 * _unit(arbiter, "TTRL arbiter") + 0.1 * _unit(format_score, "TTRL format")
  if alignment is None:
    return Reward(nogt, {"nogt": nogt, "align": 0.0, "lambda": 0.0})
  align, lam = _unit(alignment, "TTRL alignment"), _unit(lam, "TTRL lambda")
  return Reward((1.0 - lam) * nogt + lam * align, {"nogt": nogt, "align": align, "lambda": lam})


def skill_gate(confidence_value: float, evidence: int, has_procedure: bool, *,
               threshold: float = 0.98, min_evidence: int = 20,
               require_procedure: bool = True) -> bool:
  """The hard skill gate (`should_gate_update`): a skill this sure of itself (confidence >=
  threshold, evidence >= min_evidence, a procedure) freezes its bucket: every rollout of the
  group gets reward = confidence, so the group's advantages are 0 and the update is skipped."""
  if confidence_value < threshold or evidence < min_evidence:
    return False
  return has_procedure or not require_procedure
