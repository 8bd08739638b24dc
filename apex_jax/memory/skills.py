"""Skill documents: confidence, the Distiller's JSON reply (extracted, validated), storage, text.

The reply schema is the reference code's Writer output (J-Ding519/APEx,
TTRL/TTRL-nogt/local_search/skill_repository.py and Memory-Serve/memory_serve.py,
`SKILL_OUTPUT_SCHEMA`):

  {"operation": "synthesize | refine | create | skip",
   "skill": {"skill_name", "category", "modality", "description",
             "procedure": [{"step", "action", "purpose"}], "pitfalls": [...],
             "win_rate", "version", "evidence_count"},
   "absorbed_ids": [ids of the memories whose patterns the skill now captures]}

Nothing in it is trusted: every field the bank uses is type-checked, and a failure raises
`DistillerError` whose `kind` is one of ERROR_KINDS and whose message names the field and value.
The reply's win_rate / version / evidence_count are checked but not used: the bank keeps those
from its own records (a model asked to count often miscounts).

absorbed_ids: each must be an id (an int or a string, not a bool; else 'wrong_type'). An id that
is not one of the batch memories the Distiller was shown is dropped, not an error: it is not
stored on the skill and never touches a real memory, and the rest of the reply is applied. The
reference code never reads absorbed_ids at all (TTRL/TTRL-nogt/local_search/skill_repository.py
`SkillRepository.evolve_skills_with_writer`, Memory-Serve/memory_serve.py `evolve_skill` and
Writer-Train/Train/writer_skill/generate_skill_repo.py use only `operation` and `skill`, and the
Writer's reward in writer_dataset.py does not score it), so a miscopied id there costs nothing;
rejecting the whole skill document for one would throw away a reply the authors apply. The
dropped ids are returned by parse_reply so the bank can count them
(`MemoryBank.unknown_absorbed_ids`).

skill.category / skill.modality: the bucket the Distiller was asked about is the truth. A value
that differs from the bucket's (after strip / lower-case) is overwritten with the bucket's and the
skill is stored under that bucket, as the reference code does
(TTRL/TTRL-nogt/local_search/skill_repository.py `SkillRepository.evolve_skills_with_writer`:
`new_skill_data["category"] = cat`, `new_skill_data["modality"] = modality`, whatever the reply
said). The overwritten field names are returned by parse_reply so the bank can count them
(`MemoryBank.bucket_overwrites`). A value that is not a string is still 'wrong_type'.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any, NamedTuple

from apex_jax.memory.records import ProcedureStep, Skill
from apex_jax.memory.schema import Bucket, MemoryBankError
from morse_jax import jsonsafe, textscan

OPERATIONS = ("synthesize", "refine", "create", "skip")
ERROR_KINDS = ("not_json", "missing_field", "wrong_type", "bad_value")


class DistillerError(MemoryBankError):
  """A Distiller reply that cannot be applied; `kind` is one of ERROR_KINDS."""

  def __init__(self, kind: str, message: str):
    assert kind in ERROR_KINDS, kind
    super().__init__(message)
    self.kind = kind


def confidence(win_rate: float, evidence: int, n_full: int = 10) -> float:
  """gamma = w * min(n / N, 1): a skill's win rate, discounted while its evidence is thin."""
  return win_rate * min(evidence / n_full, 1.0)


# ----------------------------------------------------------------------------- JSON extraction

# a fence's language and the blanks before its body (textscan.fenced: linear time)
_FENCE_HEAD = re.compile(r"([A-Za-z]*)[ \t]*\n?")


def extract_json_object(text: Any) -> dict:
  """The first JSON object in a model reply.

  Looks after the last '</think>', then in ```json fences (then other fences), then at each '{'
  that is not inside an earlier one, with a real JSON decoder, so leading and trailing prose and
  braces inside strings are handled. An object that lies inside a '{' that did not parse (more
  '{' than '}' since it) is part of a broken reply, not the reply: it is skipped, and a reply with
  nothing else raises DistillerError('not_json') with the decoder's message for the broken
  object, e.g. a list left open. Raises DistillerError('not_json') naming what was seen.

  Never raises anything else, and runs in time linear in the reply's length: braces are matched
  in one pass (quotes count only inside braces), each top-level brace is decoded once, and an
  object inside a broken one is looked for without decoding the same text twice (a brace that
  ends before the point where the decoder failed was decoded without error, so it is an object;
  one holding that point fails at it too). Nesting deeper than `jsonsafe.MAX_DEPTH` and the
  constants NaN / Infinity do not parse (`morse_jax.jsonsafe`).
  """
  if not isinstance(text, str):
    raise DistillerError("not_json", f"reply must be a string; got {type(text).__name__}")
  body = text.rsplit("</think>", 1)[-1]
  fences = sorted(((head[1], code) for head, code in textscan.fenced(body, _FENCE_HEAD)),
                  key=lambda f: f[0].lower() != "json")
  broken = None  # (source, start, error) of the first failed '{' with an object inside
  for source in [f[1] for f in fences] + [body]:
    for root in _brace_tree(source):
      try:
        return _decode(source, root)  # a decode at a '{' gives a dict
      except json.JSONDecodeError as e:
        if broken is None and _holds_object(source, root, root.start + e.pos):
          broken = (source, root.start, e)
  if broken is not None:
    source, at, err = broken
    err = json.JSONDecodeError(err.msg, source, at + err.pos)  # line and column in the source
    raise DistillerError("not_json", f"reply's JSON object at char {at} does not parse: "
                                     f"{err.msg} (line {err.lineno} column {err.colno})")
  snippet = body.strip()[:120]
  raise DistillerError("not_json", f"reply holds no JSON object: {snippet!r}")


class _Brace(NamedTuple):
  start: int
  end: int | None  # the matching '}', None when never closed
  children: list
  level: int  # 0 for a top-level brace
  height: int  # 1 + the deepest nesting of braces inside (1: none inside)


def _decode(source: str, node: _Brace, max_depth: int | None = jsonsafe.MAX_DEPTH) -> dict:
  """The object at `node`, decoded from its own span (error positions relative to node.start:
  an error built on the whole source would count its lines, quadratic over many braces)."""
  span = source[node.start:None if node.end is None else node.end + 1]
  return jsonsafe.raw_decode(span, 0, max_depth)[0]


# a whole JSON string, or a lone quote (a string left open: the rest of the reply), or a brace
_BRACE_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}"]', re.DOTALL)


def _brace_tree(source: str) -> list[_Brace]:
  """The top-level '{' ... '}' spans of `source` with the spans nested in them, in one pass.
  Outside braces only '{' counts (prose quotes are not strings); inside, strings are skipped."""
  roots: list[_Brace] = []
  i = 0
  while True:
    at = source.find("{", i)
    if at < 0:
      return roots
    stack: list[list] = [[at, [], 1]]  # start, children, height
    for m in _BRACE_TOKENS.finditer(source, at + 1):
      c = m.group()
      if c == "{":
        stack.append([m.start(), [], 1])
      elif c == "}":
        start, children, height = stack.pop()
        node = _Brace(start, m.start(), children, len(stack), height)
        if stack:
          stack[-1][1].append(node)
          stack[-1][2] = max(stack[-1][2], height + 1)
        else:
          roots.append(node)
          i = m.end()
          break
      elif c == '"':  # a string never closed: nothing after it counts
        break
    if stack:  # never closed: everything open stays open
      while stack:
        start, children, height = stack.pop()
        node = _Brace(start, None, children, len(stack), height)
        if stack:
          stack[-1][1].append(node)
          stack[-1][2] = max(stack[-1][2], height + 1)
        else:
          roots.append(node)
      return roots


def _holds_object(source: str, node: _Brace, failed_at: int) -> bool:
  """Whether a '{' nested in `node`, whose decoding failed at `failed_at`, is a JSON object.

  Iterative. A brace holding braces nested deeper than jsonsafe.MAX_DEPTH is not an object
  (as at the top level) and is not decoded, only looked into. A decode that fails at a known
  point reads text no other decode here reads; one that fails without a point (an integer too
  long, brackets nested past the decoder's recursion limit) is reported at its start and its
  children are decoded again, so the work is linear in the reply's length (at worst
  MAX_DEPTH times it, for such rare replies)."""
  todo = [(node, failed_at)]
  while todo:
    node, failed_at = todo.pop()
    for child in node.children:
      if child.end is not None and child.end < failed_at:
        return True  # decoded without error as part of `node`: an object
      if child.start < failed_at:  # holds the failure point: fails there too
        todo.append((child, failed_at))
        continue
      if child.height > jsonsafe.MAX_DEPTH:
        todo.append((child, child.start))
        continue
      try:
        _decode(source, child, max_depth=None)
        return True
      except json.JSONDecodeError as e:
        todo.append((child, child.start + e.pos))
  return False


# ---------------------------------------------------------------------------------- validation


def _field(obj: dict, name: str, types, where: str, required: bool = True):
  if name not in obj:
    if required:
      raise DistillerError("missing_field", f"{where}: missing field {name!r}")
    return None
  value = obj[name]
  if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
    value_ok = False
  else:
    value_ok = isinstance(value, types)
  if not value_ok:
    names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
    raise DistillerError("wrong_type", f"{where}: field {name!r} must be {names}; got {value!r}")
  _storable(value, f"{where}: field {name!r}")
  return value


def _storable(value, where: str) -> None:
  """A string the bank can store: JSON allows lone surrogates ("\\ud800"), UTF-8 does not."""
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:
      raise DistillerError("bad_value", f"{where} holds {value[e.start:e.end]!r} at char "
                                        f"{e.start}, not storable as UTF-8") from None


def _procedure(raw: list, where: str) -> tuple[ProcedureStep, ...]:
  if not raw:
    raise DistillerError("bad_value", f"{where}: field 'procedure' must not be empty")
  steps = []
  for i, item in enumerate(raw):
    at = f"{where}.procedure[{i}]"
    if not isinstance(item, dict):
      raise DistillerError("wrong_type", f"{at} must be an object; got {item!r}")
    step = _field(item, "step", (int, str), at)
    if isinstance(step, str):
      # ASCII digits only: "²".isdigit() is True but int("²") raises; no more than 18 of them
      if not re.fullmatch(r"[0-9]{1,18}", step.strip()):
        raise DistillerError("wrong_type", f"{at}: field 'step' must be an integer; got {step!r}")
      step = int(step)
    steps.append(ProcedureStep(step, _field(item, "action", str, at),
                               _field(item, "purpose", str, at)))
  return tuple(steps)


def _overwritten(reported: str | None, actual: str) -> bool:
  """True when the reply names another value than the bucket's (then the bucket's is kept)."""
  return reported is not None and reported.strip().lower() != actual


class ParsedReply(NamedTuple):
  """A validated Distiller reply. `fields` is None for skip; `absorbed` are batch memory ids;
  `dropped` the absorbed ids outside the batch, as the reply spelled them, once per distinct id;
  `overwritten` the skill fields ('category', 'modality') that named another bucket's value and
  were replaced by the asked bucket's (the skill is stored under that bucket)."""
  operation: str
  fields: dict | None
  absorbed: tuple[int, ...]
  dropped: tuple[int | str, ...]
  overwritten: tuple[str, ...] = ()


def parse_reply(text: Any, bucket: Bucket, batch_ids: dict[str, int], has_skill: bool
                ) -> ParsedReply:
  """The reply for `bucket`, validated (see the module docstring).

  batch_ids maps every accepted spelling of a batch memory's id (its number, its data_id) to the
  id. An absorbed id outside the batch the Distiller was shown is dropped: it is left out of
  `absorbed` and listed in `dropped`. An absorbed id that is not an int or a string is an error.
  A skill category / modality other than the bucket's is overwritten with the bucket's (as the
  reference code does) and listed in `overwritten`; one that is not a string is an error.
  """
  reply = extract_json_object(text)
  op = _field(reply, "operation", str, "reply")
  op = op.strip().lower()
  if op not in OPERATIONS:
    raise DistillerError("bad_value", f"reply: field 'operation' must be one of {OPERATIONS}; "
                                      f"got {reply['operation']!r}")
  if op == "refine" and not has_skill:
    raise DistillerError("bad_value", f"reply: operation 'refine' needs a current skill, and "
                                      f"bucket {bucket} has none")
  raw_ids = _field(reply, "absorbed_ids", list, "reply", required=op != "skip") or []
  absorbed, dropped = [], {}
  for i, raw in enumerate(raw_ids):
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
      raise DistillerError("wrong_type", f"reply: absorbed_ids[{i}] must be an id; got {raw!r}")
    key = str(raw).strip()
    if key in batch_ids:
      absorbed.append(batch_ids[key])
    else:  # not a memory of the batch shown: dropped, counted by the caller
      dropped.setdefault(key, raw)
  absorbed, dropped = tuple(dict.fromkeys(absorbed)), tuple(dropped.values())
  if op == "skip":
    return ParsedReply(op, None, absorbed, dropped)
  skill = _field(reply, "skill", dict, "reply")
  # The asked bucket is the truth: another bucket's category / modality is overwritten with its
  # own (reference skill_repository.py evolve_skills_with_writer), the overwrite counted.
  overwritten = tuple(name for name in ("category", "modality")
                      if _overwritten(_field(skill, name, str, "skill", False),
                                      getattr(bucket, name)))
  name = _field(skill, "skill_name", str, "skill", False) or f"{bucket.category}_" \
                                                             f"{bucket.modality}_strategy"
  fields = {"name": name.strip(),
            "description": _field(skill, "description", str, "skill"),
            "procedure": _procedure(_field(skill, "procedure", list, "skill"), "skill")}
  pitfalls = _field(skill, "pitfalls", list, "skill")
  for i, p in enumerate(pitfalls):
    if not isinstance(p, str):
      raise DistillerError("wrong_type", f"skill: pitfalls[{i}] must be a string; got {p!r}")
    _storable(p, f"skill: pitfalls[{i}]")
  fields["pitfalls"] = tuple(pitfalls)
  # Checked so a malformed reply is caught, then ignored (see the module docstring).
  rate = _field(skill, "win_rate", (int, float), "skill", False)
  if rate is not None and not 0 <= rate <= 1:
    raise DistillerError("bad_value", f"skill: field 'win_rate' must be in [0, 1]; got {rate!r}")
  for name in ("version", "evidence_count"):
    value = _field(skill, name, int, "skill", False)
    if value is not None and value < 0:
      raise DistillerError("bad_value", f"skill: field {name!r} must be >= 0; got {value!r}")
  return ParsedReply(op, fields, absorbed, dropped, overwritten)


# ------------------------------------------------------------------------------------- storage


def skill_from_doc(doc: str) -> Skill:
  d = json.loads(doc)
  return Skill(d["category"], d["modality"], d["skill_name"], d["description"],
               tuple(ProcedureStep(**s) for s in d["procedure"]), tuple(d["pitfalls"]),
               d["version"], d["correct_count"], d["evidence_count"], d["operation"],
               tuple(d.get("absorbed_ids", ())))


def skill_to_doc(skill: Skill) -> str:
  return json.dumps(skill.to_dict(), ensure_ascii=False, sort_keys=True)


def load_skill(conn: sqlite3.Connection, bucket: Bucket) -> Skill | None:
  row = conn.execute("SELECT doc FROM skills WHERE category = ? AND modality = ?",
                     bucket).fetchone()
  return skill_from_doc(row[0]) if row else None


def store_skill(conn: sqlite3.Connection, skill: Skill, new_version: bool) -> None:
  """Writes the current skill; a new version also goes to skill_history (caller's transaction)."""
  doc = skill_to_doc(skill)
  conn.execute("INSERT OR REPLACE INTO skills VALUES (?, ?, ?)",
               (skill.category, skill.modality, doc))
  if new_version:
    conn.execute("INSERT INTO skill_history VALUES (?, ?, ?, ?)",
                 (skill.category, skill.modality, skill.version, doc))


# ---------------------------------------------------------------------------------------- text


def render_skill(skill: Skill, gamma: float) -> str:
  """The skill as Planner context, in the layout of the reference code's skill server
  (Serve/MIA-TTRL/agent_sever_ttrl_nogt_skill.py, /memory; procedure and pitfall lines as
  TTRL/TTRL-nogt/local_search/skill_repository.py `SkillEntry.procedure_text` / `pitfalls_text`).
  Like there, the description is not shown: the steps and pitfalls carry the guidance."""
  steps = "\n".join(f"{s.step}. {s.action} — {s.purpose}" if s.purpose else
                    f"{s.step}. {s.action}" for s in skill.procedure)
  text = (f"\n### [Matched Skill Guidance] (category: {skill.category}, modality: "
          f"{skill.modality}, confidence: {gamma:.2f})\n**Recommended Procedure:**\n{steps}\n")
  if skill.pitfalls:
    text += "\n**Known Pitfalls to Avoid:**\n" + "\n".join(f"- {p}" for p in skill.pitfalls) + "\n"
  return text


def format_batch(memories) -> str:
  """Memories for the Distiller prompt, as the reference code's `format_memories_for_writer`
  (skill_repository.py) but labelled with the bank's memory ids (what absorbed_ids must use)."""
  return "\n\n".join(f"Memory {m.id} [{m.outcome.upper()}]:\n  Question: {m.question}\n"
                     f"  Workflow: {m.workflow_summary}" for m in memories)


def _example(i: int, m) -> str:
  kind = "Image-Text" if m.caption else "Text-only"
  caption = f"- Image Caption: {m.caption}\n" if m.caption else ""
  return (f"\n--- Example {i} ({kind} modality) ---\n- Judgement: {m.outcome}\n"
          f"- Question: {m.question}\n{caption}- Workflow Summary: {m.workflow_summary}\n")


def render_memories(correct, incorrect) -> str:
  """Retrieved memories in the reference code's layout (Memory-Serve/memory_serve.py,
  `get_memories_context`): positive examples, then negative ones, or 'None found.'."""
  if not correct and not incorrect:
    return "\n### Retrieved Relevant Memories:\nNone found."
  text = "\n### Retrieved Relevant Memories:\n"
  if correct:
    text += f"\n#### Positive Examples (Successful Strategies - {len(correct)}):\n"
    text += "".join(_example(i, m) for i, m in enumerate(correct, 1))
  if incorrect:
    text += f"\n#### Negative Examples (Failure Lessons - {len(incorrect)}):\n"
    text += "".join(_example(i, m) for i, m in enumerate(incorrect, 1))
  return text
