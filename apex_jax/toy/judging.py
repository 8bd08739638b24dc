"""Judge conversations for the toy: the TTRL judges' own prompts (`apex_jax.judges`, the authors'
text verbatim) over the world's gold and corrupted executor traces, with replies the judges'
parsers read, so that the toy can act as its own in-process judge in the CPU demo.

The labels follow what each judge is asked, from facts the corpus knows:
- evaluators (reasoning, sourcing, validity; "- Score: n\\n- Reason: ..."): a fixed score and
  reason per trace kind: the gold run scores high on all three; a run that stopped early, gave a
  name the results do not support, or never searched scores low where its fault lies (validity
  only asks whether an answer was given, so it stays fairly high);
- arbiter: "A" for the gold run, "B" for any corrupted one, after the evaluator replies above;
- skill alignment: the plan's search steps against the skill procedure's: the same number 1.0,
  one off 0.5, else (or no search at all) 0.0.
Each conversation is a single user message (as the judges send it) and one reply; the arbiter's
keeps its (question, candidate) and the alignment one its (plan, skill), so the toy's evaluator
can ask the real judges the same things (`apex_jax.toy.evaluate`).
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from apex_jax.agents import prompts
from apex_jax.datasets.records import QAExample
from apex_jax.judges.align import AlignJudge
from apex_jax.judges.nogt import EVALUATORS, Candidate, EvaluatorResult, NoGtJudge
from apex_jax.toy import corpus as C

# (score, reason) per evaluator and trace kind (None: the gold run)
SCORES: dict[str | None, dict[str, tuple[int, str]]] = {
    None: {"reasoning": (8, "Each search finds the fact the next step needs."),
           "sourcing": (9, "The answer is in the search results."),
           "validity": (9, "A substantive answer is given.")},
    "early": {"reasoning": (3, "It answered before every fact was found."),
              "sourcing": (5, "The answer is an earlier fact, not the one asked."),
              "validity": (7, "An answer is given.")},
    "wrong": {"reasoning": (4, "The answer does not follow from the searches."),
              "sourcing": (2, "The answer is not in the search results."),
              "validity": (8, "An answer is given.")},
    "no_search": {"reasoning": (2, "It answered without searching."),
                  "sourcing": (1, "Nothing was retrieved to support the answer."),
                  "validity": (6, "An answer is given.")},
}
_PANEL = NoGtJudge(backend=None)  # only its message builders are used
_ALIGN = AlignJudge(backend=None)


def evaluator_reply(kind: str | None, name: str) -> str:
  score, reason = SCORES[kind][name]
  return f"- Score: {score}\n- Reason: {reason}"


def final_output(trace: Sequence[dict]) -> str:
  """The run's answer, as the episode hands it to the judges."""
  return prompts.after_think(trace[-1]["text"]).removeprefix("<answer>").removesuffix("</answer>")


def nogt_conversations(example: QAExample, trace: Sequence[dict], kind: str | None,
                       rng: random.Random, evaluators: int = 1) -> list[dict]:
  """`evaluators` of the three evaluator conversations (chosen by rng) and the arbiter's, on the
  trace as TTRL renders it (prompts.render_trace) with its final answer."""
  candidate = Candidate(final_output(trace), prompts.render_trace(example.question, trace))
  feedback = {name: EvaluatorResult(SCORES[kind][name][0], SCORES[kind][name][1],
                                    evaluator_reply(kind, name)) for name in EVALUATORS}
  out = [C.conversation("apex_judge", _PANEL.evaluator_messages(name, example.question,
                                                                candidate),
                        [evaluator_reply(kind, name)], [], f"{name}:{example.id}",
                        judge=name, kind=kind)
         for name in rng.sample(EVALUATORS, evaluators)]
  out.append(C.conversation("apex_judge", _PANEL.arbiter_messages(example.question, candidate,
                                                                  feedback),
                            ["A" if kind is None else "B"], [], f"arbiter:{example.id}",
                            judge="arbiter", kind=kind, question=example.question,
                            candidate=candidate))
  return out


def search_steps(lines: Sequence[str]) -> int:
  return sum(line.lstrip("0123456789. ").startswith(("Search", "search(")) for line in lines)


def alignment_score(plan: str, skill: Mapping) -> float:
  """1.0 when the plan has as many search steps as the skill's procedure, 0.5 when one off,
  else 0.0; 0.0 for a plan without a search (the pitfall every skill of the corpus knows)."""
  ours = search_steps(plan.splitlines())
  theirs = search_steps([step["action"] for step in skill["procedure"]])
  if ours == 0:
    return 0.0
  return {0: 1.0, 1: 0.5}.get(abs(ours - theirs), 0.0)


def alignment_conversation(example: QAExample, skill: Mapping, rng: random.Random) -> dict:
  """The alignment judge on the question's gold plan, or on it with a search step dropped or
  doubled (so every score occurs), against a skill of the question's category."""
  steps = C.plan_steps(example)
  change = rng.choice(("keep", "drop", "double"))
  if change == "drop":
    steps = steps[1:]
  elif change == "double":
    steps = steps[:1] + steps
  plan = C.numbered(steps)
  score = alignment_score(plan, skill)
  return C.conversation("apex_judge", _ALIGN.messages(plan, skill), [f"{score:.1f}"], [],
                        f"align:{example.id}", judge="alignment", score=score, plan=plan,
                        skill=skill)
