"""Reading drills: short conversations that teach the toy to copy a fact out of a tool output.

The executor's answer is a name or number that only its search results hold (every name is an
invented word of a fresh world), so answering needs copying a span from the tool output, not
recalling it. In a full executor conversation that span is ~20 of ~400 tokens; a drill is one
tool output (the searches of a few hops, rendered as the Executor renders them) and a question
per hop, each reply the executor's own answer turn:

  user:      <tool_response> A search for 'Kalkar Rula occupation' found 2 results. {...} ...
             Question: Kalkar Rula occupation
  assistant: <think>Kalkar Rula occupation: writer.</think>\\n<answer>writer</answer>
  user:      Question: Bepan headquarters
  assistant: <think>Bepan headquarters: Tarsk.</think>\\n<answer>Tarsk</answer>

The questions come in a shuffled order (not the order of the searches), so the reply must find
its hop's passage, not its position.
"""

from __future__ import annotations

import random
from typing import Sequence

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.datasets.records import Hop, QAExample
from apex_jax.toy import corpus as C
from apex_jax.toy.encode import encode_rounds


def world_hops(examples: Sequence[QAExample]) -> list[Hop]:
  """Every distinct hop of the examples' gold chains (by query), in order."""
  seen, out = set(), []
  for ex in examples:
    for hop in ex.chain:
      if hop.query not in seen:
        seen.add(hop.query)
        out.append(hop)
  return out


def drill(hops: Sequence[Hop], searcher, config: AgentConfig, rng: random.Random,
          example_id: str, spaced: bool = False) -> dict | None:
  """One drill over `hops` (None when a search misses its hop's gold passage); spaced: the
  answers after a space (corpus.copied)."""
  results = searcher.search([h.query for h in hops], topk=config.topk)
  if any(h.passage_id not in [p.id for p in r] for h, r in zip(hops, results)):
    return None
  order = list(hops)
  rng.shuffle(order)
  tool = prompts.tool_message(C.tool_output([h.query for h in hops], results))["content"]
  opening = [{"role": "user", "content": f"{tool}\nQuestion: {order[0].query}"}]
  replies = [C._answer_turn(f"{h.query}: {h.answer}.", h.answer, spaced) for h in order]
  follow = [[{"role": "user", "content": f"Question: {h.query}"}] for h in order[1:]]
  return C.conversation("apex_read", opening, replies, follow, example_id)


def drills(examples: Sequence[QAExample], searcher, config: AgentConfig, rng: random.Random,
           per_drill: int = 3, spaced: bool = False) -> tuple[list[dict], int]:
  """(drills, missed): the world's hops shuffled into groups of `per_drill`, one drill each."""
  if isinstance(per_drill, bool) or not isinstance(per_drill, int) or per_drill < 1:
    raise ValueError(f"drills: per_drill must be an integer >= 1, got {per_drill!r}")
  hops = world_hops(examples)
  rng.shuffle(hops)
  out, missed = [], 0
  for i in range(0, len(hops) - per_drill + 1, per_drill):
    d = drill(hops[i:i + per_drill], searcher, config, rng, f"read:{hops[i].query}", spaced)
    if d is None:
      missed += 1
    else:
      out.append(d)
  return out, missed


def reading_prompts(examples, searcher, config, tok, spaced: bool = False,
                    ) -> list[tuple[list[int], str, str, object]]:
  """(prompt tokens, "query" | "answer", gold, example) per reply after a tool output of each
  gold run (executor_rounds, no plan; spaced: its copies after a space): the conversation's
  tokens teacher-forced up to that reply, which is the next hop's search (gold: its query) or
  the answer (gold: the answer)."""
  rows = []
  for ex in examples:
    gold = C.executor_rounds(ex, searcher, config, spaced=spaced)
    if gold is None:
      continue
    tokens, _, ends = encode_rounds(C.executor_conversation(ex, gold, None, config), tok)
    for k in range(1, len(gold)):
      start = ends[k] - len(tok.encode(gold[k]["text"])) - 1  # the reply and its <|im_end|>
      last = k == len(gold) - 1
      rows.append(([int(t) for t in tokens[:start]], "answer" if last else "query",
                   ex.answers[0] if last else ex.chain[k].query, ex))
  return rows
