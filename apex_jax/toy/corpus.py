"""Supervised APEx conversations from the synthetic world's gold hop chains, rendered with the
prompt builders the agents use at run time (`apex_jax.agents.prompts`, AgentConfig.prompts), so
that the toy is trained on exactly the chats it later meets.

A conversation is a dict in the shape of `morse_jax.toy.corpus` turns plus rounds:
  {"role": "apex_execute" | "apex_plan" | "apex_distill", "messages": opening chat,
   "target": first assistant reply, "rounds": [{"messages": [...], "target": reply}, ...],
   "example_id": str, ...}
`messages` + `target` alone is a valid single-turn example (`morse_jax.toy.sft.encode`);
`apex_jax.toy.encode` encodes every round, training on the assistant replies only.

- executor: per hop `<think>` + a search call with the hop's gold query, the tool output as the
  Executor renders it (this module's `tool_output`, checked against the real Executor in the
  tests) from a real search over the world, then `<think>` + `<answer>` with the gold answer.
  Half of the runs carry the gold plan in the prompt (the episode's case), half none.
- planner: [system, plan prompt] -> plan derived from the chain; judge prompt with an executor
  trace -> "no" for the gold trace, "yes" for a corrupted one (stopped early, a wrong answer, no
  search), then the replan prompt -> the remaining steps.
- distiller: a skill JSON reply (synthesize, then refine) per category for a batch of memories
  whose workflows are the gold or corrupted traces; valid for MemoryBank.apply_distiller_reply.
  A quarter of the runs also get a summary turn (their workflow), as Distiller.remember asks.
- half of the plan prompts show earlier memories (and half of those a skill) of the question's
  category, laid out as the bank shows them, with the same plan as reply.

Worlds with procedures (apex_jax.datasets.world_records): a chain's record step is
"<entity> <word> record". The plan names the word only when the plan prompt shows it (a positive
memory's workflow, else the skill's procedure: `shown_record_word`), else it reads
`Search one record of <entity>.`; the executor follows a plan naming the word, and otherwise
searches a record picked at random from the listing, or the first listed (`record_guess`;
`reread`), and answers its value.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Sequence

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.prompts import numbered
from apex_jax.datasets.records import QAExample
from apex_jax.memory import skills as skills_lib
from apex_jax.memory.records import Memory
from apex_jax.memory.schema import Bucket
from apex_jax.memory.store import MemoryBank
from apex_jax.tools import format_results, render_tool_call

# judge: apex_jax.toy.judging, read: apex_jax.toy.reading (both opt-in)
ROLES = ("apex_execute", "apex_plan", "apex_distill", "apex_judge", "apex_read")
CORRUPTIONS = ("early", "wrong", "no_search")
RECORD_GUESSES = ("random", "first")  # CorpusConfig.record_guess
MODALITY = "text-only"  # the world's questions have no image
_NAME = re.compile(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_RECORD_SUFFIX, _LISTING_SUFFIX = " record", " records"  # of world_records' queries
# search("Kalkar Rula vesk record") -> vesk (the quote looked at, not taken: `noisy_workflow`)
RECORD_WORD = re.compile(r'\b([a-z]+) record(?=["\'])')
_RECORD_SEARCH = re.compile(r'search\((["\'])\s*(.*?) [a-z]+ record\1\)')


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  plan_share: float = 0.5  # executor runs whose prompt carries the gold plan
  negative_share: float = 0.5  # planner conversations judging a corrupted trace
  distill_batch: int = 4  # memories per distiller prompt
  distill_batches: int = 2  # prompts per category and world: a synthesis, then refinements
  summary_share: float = 0.25  # runs (gold or corrupted) whose workflow summary is a turn
  context_share: float = 0.5  # planner prompts showing earlier memories (and a skill) of the
  # question's category, as the bank shows them at run time: the plan must not depend on them
  judge_share: float = 0.0  # runs (gold or corrupted) judged by one evaluator and the arbiter
  align_share: float = 0.0  # questions whose plan the skill-alignment judge scores
  reading_hops: int = 0  # hops per reading drill (apex_jax.toy.reading); 0: no drills
  spaced_copies: bool = False  # the executor's queries and answers after a space (`copied`)
  word_plan_share: float = 0.5  # executor plans of a procedure question that name the record
  # word (the others: the generic record step); the runs without such a plan guess a record
  memory_noise: float = 0.0  # memories of procedure runs whose workflow drops or garbles the
  # record word, as the toy Distiller's summaries do at run time (`noisy_workflow`): the planner
  # learns to plan from what a positive memory shows, and the generic step when it shows none
  record_guess: str = "random"  # without a plan naming the word, the executor reads a record
  # picked at random from the listing ("random"), or the first one listed ("first"): a rule the
  # toy can follow greedily, and since each entity's listing is shuffled, its unguided guesses
  # spread over the words, so memory building finds every category's word (RESULTS, run 10)
  mia_share: float = 0.0  # questions that also get the comparison systems' drills
  # (`mia_forms`): Memento's plan from its cases, ExpeL's rule call and the executor with a rule,
  # so that the toy meets their prompt forms as it meets APEx's (issue 57: none favoured)
  fresh_record_words: float = 0.0  # planner conversations of a procedure category whose record
  # words are swapped, consistently in prompt and replies, for words drawn anew: the run-8
  # planner garbled the word a memory showed (`girnal` for `girnos`; RESULTS, "The procedure
  # demo on three worlds"), after seeing each world's three words in many prompts
  context_negatives: int = 1  # incorrect memories a plan prompt shows (the demo's bank: k = 2)
  decoy_negatives: bool = False  # those shown are wrong-record runs first: the demo's negative
  # memories are mostly decoy reads, and the run-8 planner copied their words (10 of 16 plans
  # on world 777; RESULTS, "Exploring in memory building"), having mostly been shown negatives
  # that were corrupted gold runs, whose word is the right one

  def __post_init__(self):
    for name in ("plan_share", "negative_share", "summary_share", "context_share", "judge_share",
                 "align_share", "word_plan_share", "memory_noise", "fresh_record_words",
                 "mia_share"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"CorpusConfig.{name} must be in [0, 1], got {value!r}")
    if self.record_guess not in RECORD_GUESSES:
      raise ValueError(f"CorpusConfig.record_guess must be one of {RECORD_GUESSES}, got "
                       f"{self.record_guess!r}")
    if isinstance(self.reading_hops, bool) or not isinstance(self.reading_hops, int) \
        or self.reading_hops < 0:
      raise ValueError(f"CorpusConfig.reading_hops must be an integer >= 0, got "
                       f"{self.reading_hops!r}")
    for name, low in (("distill_batch", 1), ("distill_batches", 1), ("context_negatives", 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"CorpusConfig.{name} must be an integer >= {low}, got {value!r}")


def tool_output(queries: Sequence[str], results) -> str:
  """The Executor's tool response text (Executor._tool_output, verl's search tool: one line per
  query, a count, then that query's results as JSON)."""
  return "\n".join(f"A search for '{q}' found {len(passages)} results. "
                   + json.dumps({"result": format_results([passages])}, ensure_ascii=False)
                   for q, passages in zip(queries, results))


# ---------------------------------------------------------------------------------- plans

def record_step(example: QAExample) -> int | None:
  """The index of the hop that reads a record (worlds with procedures), or None."""
  return next((k for k, h in enumerate(example.chain) if h.query.endswith(_RECORD_SUFFIX)), None)


def record_entity(query: str) -> str:
  """"Kalkar Rula vesk record" -> "Kalkar Rula"."""
  return query[:-len(_RECORD_SUFFIX)].rsplit(" ", 1)[0]


def plan_steps(example: QAExample, record_word: str | None = None) -> list[str]:
  """One search step per hop, a later hop's query naming the earlier result it depends on as
  "<result of step j>" (a plan must hold no facts), then the step that gives the answer. A record
  step (worlds with procedures) searches `record_word`'s record, or without one reads
  `Search one record of <entity>.`"""
  steps, known = [], []
  for k, hop in enumerate(example.chain):
    query = hop.query
    if k == record_step(example):
      query = record_entity(query) + (f" {record_word}{_RECORD_SUFFIX}" if record_word else "")
    for j, answer in known:
      query = query.replace(answer, f"<result of step {j}>")
    steps.append(f'Search "{query}".' if k != record_step(example) or record_word else
                 f"Search one record of {query}.")
    known.append((len(steps), hop.answer))
  n = len(steps)
  final = {"age": "Subtract the birth year from the release year.",
           "before": "Compare the two birth years.",
           "first": "Pick the film with the earlier year.",
           "same": "Compare the two birth cities."}.get(example.kind,
                                                        f"Answer with the result of step {n}.")
  return steps + [final]


def plan_reply(example: QAExample, record_word: str | None = None) -> str:
  return f"<think>{example.hops} searches.</think>\n{numbered(plan_steps(example, record_word))}"


def positive_memories(memory: str) -> str:
  """The positive examples of a memory section as the bank renders it (before the negatives)."""
  return memory.split("#### Negative Examples")[0]


def shown_record_word(skill: str, memory: str) -> str | None:
  """The record word a plan prompt shows: searched in a positive memory's workflow, else in the
  skill's procedure; None when neither shows one (a negative memory's word is a failed guess)."""
  found = RECORD_WORD.search(positive_memories(memory)) or RECORD_WORD.search(skill)
  return found.group(1) if found else None


def reread(example: QAExample, records, word: str) -> QAExample:
  """The example as a run reading `word`'s record sees it: that record's hop, its value as the
  answer (records: the entity's world_records.Record tuple)."""
  k = record_step(example)
  record = next(r for r in records if r.word == word)
  hop = example.chain[k]
  chain = example.chain[:k] + (dataclasses.replace(
      hop, query=f"{record_entity(hop.query)} {word}{_RECORD_SUFFIX}", passage_id=record.passage_id,
      title=f"{record_entity(hop.query)} {word}{_RECORD_SUFFIX}", answer=record.value),
  ) + example.chain[k + 1:]
  return dataclasses.replace(example, chain=chain, answers=(record.value,))


# ------------------------------------------------------------------------------- executor

def _answer_think(example: QAExample) -> str:
  if example.kind == "chain":
    last = example.chain[-1]
    return f"{last.query}: {last.answer}."
  return " ".join(f"{h.query}: {h.answer}." for h in example.chain)


def copied(text: str, spaced: bool) -> str:
  """A span the reply copies (a search query, an answer) as the reply writes it: with `spaced`,
  after a space, so that a byte-level BPE splits its words as it does where they are read (after
  a space in the question and the passages: " Desma" is one piece there, "Desma" after `>` or a
  quote is "D" "es" "ma"); the parsers strip it (parse_turn; the searches match words)."""
  return f" {text}" if spaced else text


def _search_turn(hops_done: Sequence, hop, spaced: bool = False) -> str:
  # a record listing is not restated: with it the turn outgrows the demo's 80 new tokens
  restate = hops_done and not hops_done[-1].query.endswith(_LISTING_SUFFIX)
  prev = f"{hops_done[-1].query}: {hops_done[-1].answer}. " if restate else ""
  call = render_tool_call([copied(hop.query, spaced)])
  return f"<think>{prev}Next: {hop.query}.</think>\n{call}"


def _answer_turn(think: str, answer: str, spaced: bool = False) -> str:
  return f"<think>{think}</think>\n<answer>{copied(answer, spaced)}</answer>"


def executor_rounds(example: QAExample, searcher, config: AgentConfig,
                    stop_after: int | None = None, answer: str | None = None,
                    spaced: bool = False) -> list[dict] | None:
  """[{"text", "tool_output"}] per assistant turn: the gold run, or with stop_after / answer a
  corrupted one (stops after that many searches / gives that answer). None when a search misses
  its hop's gold passage (the gold run would not be what the tool shows). spaced: queries and
  the answer written after a space (`copied`), the tool output showing the query as sent."""
  hops = example.chain[:stop_after] if stop_after is not None else example.chain
  turns = []
  for k, hop in enumerate(hops):
    query = copied(hop.query, spaced)
    (passages,) = searcher.search([query], topk=config.topk)
    if hop.passage_id not in [p.id for p in passages]:
      return None
    turns.append({"text": _search_turn(hops[:k], hop, spaced),
                  "tool_output": tool_output([query], [passages])})
  if stop_after is None:
    think = _answer_think(example)
  else:
    think = f"{hops[-1].query}: {hops[-1].answer}." if hops else "I know this."
  turns.append({"text": _answer_turn(think, answer or example.answers[0], spaced),
                "tool_output": None})
  return turns


def conversation(role: str, opening: list[dict], replies: Sequence[str],
                 follow_ups: Sequence[list[dict]], example_id: str, **extra) -> dict:
  """replies[0] answers `opening`; replies[i] answers follow_ups[i - 1]."""
  if len(follow_ups) != len(replies) - 1:
    raise ValueError(f"{len(replies)} replies need {len(replies) - 1} follow-ups, got "
                     f"{len(follow_ups)}")
  return {"role": role, "messages": opening, "target": replies[0],
          "rounds": [{"messages": m, "target": r} for m, r in zip(follow_ups, replies[1:])],
          "example_id": example_id, **extra}


def executor_conversation(example: QAExample, turns: list[dict], plan: str | None,
                          config: AgentConfig, opening: list[dict] | None = None,
                          **extra) -> dict:
  """opening: another system's executor prompt (`mia_forms`: ExpeL's rule after the question);
  None: APEx's, with `plan`."""
  if opening is None:
    opening = prompts.executor_messages(example.question, plan, config.prompt_style)
  follow = [[prompts.tool_message(t["tool_output"])] for t in turns[:-1]]
  return conversation("apex_execute", opening, [t["text"] for t in turns], follow, example.id,
                      **extra)


# -------------------------------------------------------------------------------- planner

def corrupt(example: QAExample, searcher, config: AgentConfig, kind: str,
            rng: random.Random, names: Sequence[str], spaced: bool = False,
            ) -> tuple[list[dict] | None, int]:
  """A wrong run of `kind` and how many hops it searched (spaced: as in executor_rounds)."""
  wrong = rng.choice([n for n in names if n not in example.answers] or ["unknown"])
  if kind == "early" and example.hops > 1:
    k = rng.randrange(1, example.hops)
    return executor_rounds(example, searcher, config, k, example.chain[k - 1].answer, spaced), k
  if kind == "wrong":
    return executor_rounds(example, searcher, config, None, wrong, spaced), example.hops
  return executor_rounds(example, searcher, config, 0, wrong, spaced), 0


def planner_context(category: str, earlier: Sequence[Memory], with_skill: bool,
                    negatives: Sequence[Memory] | None = None) -> tuple[str, str]:
  """(skill text, memory text) of a plan prompt as `planner.context_slots` gives them, from
  earlier memories of the question's category: the last two correct ones, `negatives` as the
  incorrect ones (None: the last incorrect one), and (with_skill) the skill a distiller reply
  built from all of them."""
  good = [m for m in earlier if m.correct][-2:]
  bad = [m for m in earlier if not m.correct][-1:] if negatives is None else list(negatives)
  memory = skills_lib.render_memories(good, bad).strip()
  if not with_skill or not earlier:
    return prompts.NO_SKILL, memory
  doc = skill_reply(category, earlier, None, [])["skill"]
  skill = skills_lib.skill_from_doc(json.dumps({
      **doc, "correct_count": sum(m.correct for m in earlier), "operation": "synthesize"}))
  return skills_lib.render_skill(skill, skill.win_rate).strip(), memory


def swap_words(conversation: dict, swap: dict[str, str]) -> dict:
  """The conversation with each word of `swap` replaced (whole words) in every message and
  reply, rounds included."""
  if not swap:
    return conversation
  pattern = re.compile(r"\b(" + "|".join(map(re.escape, swap)) + r")\b")

  def sub(text: str) -> str:
    return pattern.sub(lambda m: swap[m.group(1)], text)

  def messages(ms):
    return [{**m, "content": sub(m["content"])} for m in ms]

  out = {**conversation, "messages": messages(conversation["messages"]),
         "target": sub(conversation["target"])}
  if "rounds" in conversation:
    out["rounds"] = [{**r, "messages": messages(r["messages"]), "target": sub(r["target"])}
                     for r in conversation["rounds"]]
  return out


_SHOWN = object()  # planner_conversation's word: the one its context shows


def planner_conversation(example: QAExample, trace: list[dict], searched: int, correct: bool,
                         config: AgentConfig, context: tuple[str, str] | None = None, *,
                         opening: list[dict] | None = None, word=_SHOWN) -> dict:
  """context: (skill text, memory text) shown in the plan prompt (None: no skill, no memory).
  A record step names the word the context shows (`shown_record_word`), if any. opening, word:
  another system's plan prompt and the word it shows (`mia_forms`: Memento's cases)."""
  skill, memory = context or (prompts.NO_SKILL, skills_lib.render_memories([], []).strip())
  if word is _SHOWN:
    word = shown_record_word(skill, memory) if record_step(example) is not None else None
  if opening is None:
    opening = prompts.plan_messages(skill, memory, example.question, config.plan_word_limit,
                                    config.prompt_style)
  n = example.hops
  supported = "in" if correct else "not in"
  decision = (f"<think>{searched} of {n} searches done; the answer is {supported} the "
              f"results.</think>\n{'no' if correct else 'yes'}")
  replies, follow = [plan_reply(example, word), decision], [[prompts.judge_message(
      example.question, trace, config.prompt_style)]]
  if not correct:
    remaining = plan_steps(example, word)[searched:]
    replies.append(f"<think>Stopped after {searched} searches.</think>\n{numbered(remaining)}")
    follow.append([prompts.replan_message(example.question, None, config.replan_word_limit,
                                          config.prompt_style)])
  return conversation("apex_plan", opening, replies, follow, example.id, replan=not correct)


# ------------------------------------------------------------------------------ distiller

def workflow(trace: list[dict]) -> str:
  """A memory's workflow summary of a run: its searches and its answer, one step a line."""
  return prompts.rule_workflow([t["text"] for t in trace])


def noisy_workflow(text: str, rng: random.Random) -> str:
  """A workflow whose record searches lost their word (half) or had one letter of it changed
  (half), as a weak Distiller writes them; the other steps as they were."""
  drop = rng.random() < 0.5

  def damage(match: re.Match) -> str:
    word = match.group(1)
    if drop:
      return "record"
    k = rng.randrange(len(word))
    letter = rng.choice([c for c in "abdeiklmnoprstuvz" if c != word[k]])
    return f"{word[:k]}{letter}{word[k + 1:]} record"

  return RECORD_WORD.sub(damage, text)


def summary_conversation(example: QAExample, trace: list[dict], config: AgentConfig) -> dict:
  """The Distiller's summary turn of a run (Distiller.summarize on prompts.render_trace), whose
  reply is the run's `workflow`: what the memories of later plan prompts show."""
  opening = prompts.summary_messages(prompts.render_trace(example.question, trace),
                                    config.prompt_style)
  return conversation("apex_distill", opening, [workflow(trace)], [], f"summary:{example.id}",
                      summary=True)


PITFALLS = {"early": "Answering before every search is done.",
            "wrong": "Answering with a name the results do not support.",
            "no_search": "Answering without searching.",
            "wrong_record": "Answering from a record that correct runs did not read."}


def skill_reply(category: str, batch: Sequence[Memory], current: dict | None,
                pitfalls_seen: Sequence[str]) -> dict:
  """A synthesize (no current skill) or refine reply: the procedure of the batch's first correct
  workflow with names generalised to X (no answer in it), the pitfalls of its incorrect ones.
  The lowercase record word of a correct workflow survives (search("X vesk record")); without a
  correct one, a record search reads "search one record of X" (a failed run's word is a wrong
  guess), and a refinement with a correct one replaces such a generic procedure."""
  good = [m for m in batch if m.correct]
  source = (good or batch)[0].workflow_summary.splitlines()
  steps = [{"step": i, "action": _generic(_NAME.sub("X", line.split(". ", 1)[1]), not good),
            "purpose": "find the next fact"} if "search(" in line else
           {"step": i, "action": "answer with the last fact found", "purpose": "give the answer"}
           for i, line in enumerate(source, 1)]
  if current is not None and not (good and _has_generic(current["procedure"])):
    steps = current["procedure"]
  pitfalls = sorted(set(pitfalls_seen) | set(current["pitfalls"] if current else ()))
  n = len(batch) + (current["evidence_count"] if current else 0)
  wins = len(good) + (round(current["win_rate"] * current["evidence_count"]) if current else 0)
  skill = {"skill_name": f"{category}_{MODALITY}_strategy", "category": category,
           "modality": MODALITY, "description": f"Search each fact a {category} question needs.",
           "procedure": steps,
           "pitfalls": pitfalls or [PITFALLS["early"]], "win_rate": round(wins / n, 2),
           "version": 1 + (current["version"] if current else 0), "evidence_count": n}
  return {"operation": "synthesize" if current is None else "refine", "skill": skill,
          "absorbed_ids": [m.id for m in good]}


def _generic(action: str, generic: bool) -> str:
  return _RECORD_SEARCH.sub(r"search one record of \2", action) if generic else action


def _has_generic(procedure) -> bool:
  return any(str(s.get("action", "")).startswith("search one record of") for s in procedure)


def distiller_conversations(category: str, batches: Sequence[Sequence[Memory]],
                            pitfalls: Sequence[Sequence[str]], config: AgentConfig) -> list[dict]:
  """Synthesis on the first batch, refinement on each later one. Each reply is applied to a
  scratch in-memory MemoryBank (a reply it rejects is a bug here: raised), and the current
  skill the next prompt shows is the bank's, rendered as the Distiller renders it."""
  bucket, out = Bucket(category, MODALITY), []
  with MemoryBank(":memory:", embedder=lambda texts: None) as bank:
    for batch, seen in zip(batches, pitfalls):
      skill = bank.get_skill(bucket)
      doc = None if skill is None else {k: v for k, v in skill.to_dict().items()
                                        if k in prompts.SKILL_FIELDS}
      reply = json.dumps(skill_reply(category, batch, doc, seen), ensure_ascii=False)
      opening = prompts.skill_messages(bucket, batch, skill, config.prompt_style)
      result = bank.apply_distiller_reply(bucket, reply, batch=list(batch), strict=True)
      assert result.applied, result
      out.append(conversation("apex_distill", opening, [reply], [], f"{category}:{batch[0].id}",
                              bucket=tuple(bucket), memory_ids=[m.id for m in batch],
                              has_skill=doc is not None))
  return out
