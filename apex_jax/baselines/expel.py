"""ExpeL's rule bank on a MemoryBank, as Memory-Serve/Expel.py keeps it: one rule per memory (the
memory's workflow summary). After each memory-building episode an LLM call is shown the episode's
trace (as the successful or the failed trial) and the rules of the 3 memories whose questions are
most similar, and replies one operation:
  AGREE n   an existing rule fits: nothing changes
  EDIT n    rule n is rewritten (the memory keeps its question and outcome)
  ADD       a new memory holds the new rule (with the episode's question and outcome)
A reply that does not parse or names no shown rule changes nothing, counted by kind and logged.
At test time the most similar memory's rule goes into the executor's prompt.

Where Expel.py is not followed: its EDIT indexes the bucket by the shown rule's number, not the
shown memory's index (we edit the memory shown as that number); its test-time retrieval scores
with `cosine_weight` / `win_rate_weight`, which its MemoryProcessor never sets, so the bare
`except` there returns no rule at all; we rank by cosine alone (Memento.py's weights 1 / 0).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax

from apex_jax.agents.conversation import Conversation
from apex_jax.agents import baseline_prompts as prompts
from apex_jax.memory import DistillerError, Memory, MemoryBank, NewMemory, extract_json_object

log = logging.getLogger(__name__)

OPERATIONS = ("AGREE", "EDIT", "ADD")
ERROR_KINDS = ("no_json", "missing_field", "operation", "rule_number", "rule_content")
SIMILAR = prompts.EXPEL_SIMILAR
OTHERS = "others"  # MIA's memory servers classify every question as "others": one bucket


class RuleReplyError(ValueError):
  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


@dataclasses.dataclass(frozen=True)
class RuleOp:
  operation: str  # AGREE / EDIT / ADD
  rule_number: int  # 1-based among the rules shown (0 for ADD)
  rule_content: str  # the new or edited rule ("" for AGREE)


def parse_rule_op(text: str, shown: int) -> RuleOp:
  """The reply's JSON object, checked as Expel.py's RULE_OPT_SCHEMA (all three fields, the
  operation one of OPERATIONS) and against the `shown` rules: AGREE / EDIT name one of them,
  EDIT / ADD carry a non-empty rule. Raises RuleReplyError (its `kind` one of ERROR_KINDS)."""
  try:
    obj = extract_json_object(text)
  except DistillerError as err:
    raise RuleReplyError("no_json", f"no JSON object in the reply: {err}") from err
  missing = [k for k in ("operation", "rule_number", "rule_content") if k not in obj]
  if missing:
    raise RuleReplyError("missing_field", f"the reply has no {missing[0]!r}")
  op, number, content = obj["operation"], obj["rule_number"], obj["rule_content"]
  if not isinstance(op, str) or op.strip().upper() not in OPERATIONS:
    raise RuleReplyError("operation", f"operation {op!r} not in {OPERATIONS}")
  op = op.strip().upper()
  if not isinstance(content, str):
    raise RuleReplyError("rule_content", f"rule_content must be a string, got {content!r}")
  if op != "ADD" and (isinstance(number, bool) or not isinstance(number, int)
                      or not 1 <= number <= shown):
    raise RuleReplyError("rule_number", f"rule_number {number!r} of {op} names none of the "
                                        f"{shown} rules shown")
  if op != "AGREE" and not content.strip():
    raise RuleReplyError("rule_content", f"rule_content of {op} is empty")
  return RuleOp(op, 0 if op == "ADD" else number, "" if op == "AGREE" else content.strip())


def nearest(bank: MemoryBank, question: str, k: int) -> list[Memory]:
  """The k memories of OTHERS whose questions are most similar (cosine, either outcome), most
  similar first. The bank ranks each outcome apart: the best k of the two top-k lists are the
  best k overall."""
  found = bank.retrieve(question, category=OTHERS, k=k)
  scored = sorted(found.correct + found.incorrect, key=lambda s: (-s.sim, s.memory.id))
  return [s.memory for s in scored[:k]]


def apply_rule_op(bank: MemoryBank, op: RuleOp, shown: Sequence[Memory], *, question: str,
                  correct: bool, data_id: str | None = None) -> str:
  """The operation on the bank: 'agreed', 'edited' or 'added'. ExpeL keeps every rule: an ADD
  is stored without the bank's deduplication (Expel.py adds entries as they come)."""
  if op.operation == "AGREE":
    return "agreed"
  if op.operation == "EDIT":
    bank.set_summary(shown[op.rule_number - 1].id, op.rule_content)
    return "edited"
  bank.add_many([NewMemory(question, op.rule_content, correct, category=OTHERS,
                           data_id=data_id)], dedup=False)
  return "added"


@dataclasses.dataclass
class RuleBook:
  """The rule updates of memory building: one distiller-role sampler call per batch of
  episodes, each shown the rules as the bank stood before the batch, applied in order."""

  generator: object
  agents: object  # AgentConfig: prompt style, distiller tokens and sampling
  bank: MemoryBank

  def update(self, questions: Sequence[str], traces: Sequence[str], correct: Sequence[bool], *,
             rng: jax.Array, data_ids: Sequence[str | None] | None = None) -> dict:
    """Counts: agreed / edited / added, and rule_errors plus rule_error_<kind>."""
    data_ids = [None] * len(questions) if data_ids is None else list(data_ids)
    shown = [nearest(self.bank, q, SIMILAR) for q in questions]
    chats = [prompts.expel_messages(q, t, ok, [m.workflow_summary for m in s],
                                    self.agents.prompts)
             for q, t, ok, s in zip(questions, traces, correct, shown)]
    tokenizer = self.generator.tokenizer_of("distiller")
    gens = self.generator.generate(
        "distiller", [Conversation.start(tokenizer, c).tokens() for c in chats], rng=rng,
        max_new_tokens=self.agents.distiller_max_new_tokens, sampling=self.agents.sampling)
    if len(gens) != len(chats):
      raise RuntimeError(f"generator returned {len(gens)} generations for {len(chats)} prompts")
    counts = dict(agreed=0, edited=0, added=0, rule_errors=0)
    for q, ok, s, gen, data_id in zip(questions, correct, shown, gens, data_ids):
      try:
        op = parse_rule_op(gen.text, len(s))
      except RuleReplyError as err:
        log.warning("ExpeL rule reply not applied (%s): %s", err.kind, err)
        counts["rule_errors"] += 1
        counts[f"rule_error_{err.kind}"] = counts.get(f"rule_error_{err.kind}", 0) + 1
        continue
      counts[apply_rule_op(self.bank, op, s, question=q, correct=ok, data_id=data_id)] += 1
    return counts
