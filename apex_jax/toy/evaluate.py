"""Held-out check of a toy backbone on the APEx formats, with the real agents and greedy decoding,
and of its MoRSE executor turns (did the APEx training make it forget them?).

  python -m apex_jax.toy.evaluate --model=/tmp/toy_apex_try --world_seed=12345 --questions=32

APEx: a fresh world (names no training world has), the toy's WordSearch (--search=ngram: its
NgramSearch) as the tool, the bare backbone for every module (SeparateGenerator without
experts), AgentConfig(prompts=--prompts: "compact", the toy's, or "authors").
  executor alone: format_valid = turns that parse_turn accepts / turns; search_then_answer =
    runs with >= 1 search and an answer / runs; EM / F1 (datasets.metrics.evaluate)
  planner -> executor (with the plan) -> planner evaluate: plan non-empty rate, decision parse
    rate (parse_decision found yes / no), exact rate (exactly yes / no), replan rate, EM / F1.
  distiller: greedy replies to the world's skill prompts (synthesis, then refinement, built as
    the corpus builds them), each checked by `skills.parse_reply` as the bank would: applied
    count and valid rate, error kinds, and the absorbed ids the bank would drop (not in the
    batch shown: unknown_absorbed_ids, and the applied replies that had any) and the skill
    category / modality fields it would overwrite with the bucket's (bucket_overwrites, and the
    applied replies that had any).
judges: the TTRL judges as the demo runs them (NoGtJudge and AlignJudge over InProcessChat on
  the bare toy, 32-token replies) on the world's gold and corrupted runs of the corpus
  (apex_jax.toy.judging): failure counts per judge, the arbiter's verdicts against the run's
  kind (gold: correct, corrupted: incorrect) and its accuracy, the mean evaluator score per
  kind, and the alignment scores that equal the corpus's label.
MoRSE: greedy executor turns of fresh synthetic problems (seed 12345, train categories) with gold
contexts, scored by `Synthetic.score_node` with the gold ancestors upstream: node pass rate.
"""

from __future__ import annotations

import collections
import json
import time

import jax
from absl import app, flags

from apex_jax.agents import AgentConfig, Executor, Planner, SeparateGenerator
from apex_jax.datasets import metrics
from apex_jax.datasets.world import World
from apex_jax.memory import skills
from apex_jax.memory.schema import Bucket
from apex_jax.tools import Answer, FormatError, parse_turn, ToolCall
from apex_jax.tools.overlap import NgramSearch, WordSearch
from apex_jax.toy import build, reading
from apex_jax.toy.judge_eval import judge_metrics
from morse_jax import llm
from morse_jax.llm.engine import Engine, config_for_rows
from morse_jax.tasks import synthetic
from morse_jax.toy import corpus

def define_flags() -> None:
  """The command line's flags, defined when run as a program, not at import: tests import
  this module beside launchers whose flags share names (absl flags are process-wide)."""
  flags.DEFINE_string("model", "", "Hugging Face folder of the toy backbone.")
  flags.DEFINE_integer("world_seed", 12345, "Seed of the held-out world.")
  flags.DEFINE_integer("questions", 32, "Held-out questions.")
  flags.DEFINE_integer("morse_problems", 6, "Synthetic problems (0: skip).")
  flags.DEFINE_integer(
      "distill_questions", 400, "Questions of the world whose memories fill the distiller's "
      "prompts (at most 2 prompts per category, as in the corpus).")
  flags.DEFINE_integer("judge_runs", 24, "Runs (gold and corrupted) the judges "
                       "score, and plans the alignment judge scores (0: skip).")
  flags.DEFINE_enum("search", "word", ["word", "ngram"], "The executor's search tool: "
                    "apex_jax.tools.overlap WordSearch or NgramSearch (the corpus is "
                    "built with WordSearch either way).")
  flags.DEFINE_integer("topk", 3, "Passages per search (as in the training corpus).")
  flags.DEFINE_string("out", "", "Write the metrics (and sample turns) here as JSON.")
  flags.DEFINE_enum("prompts", "compact", ["compact", "authors"], "The agents' prompt "
                    "style (AgentConfig.prompts): the toy was taught the compact ones; "
                    "a real instruct backbone may follow the authors' text better.")
  flags.DEFINE_enum("reading", "yes", ["yes", "no", "only"], "The executor reading "
                    "its gold passages (reading_metrics); only: that and nothing else.")
  flags.DEFINE_bool("spaced_copies", False, "The reading check's gold runs with their "
                    "queries and answers after a space (a toy trained with "
                    "pretrain_toy --config.corpus.spaced_copies=True).")
  flags.DEFINE_integer("distill_max_new_tokens", 400, "The distiller's reply "
                       "cap (0: skip the distiller check).")


def greedy_replies(model, prompts, max_new_tokens: int) -> llm.SampleOutput:
  """`prompts`' greedy replies (`llm.sample`'s output) from one `Engine.generate` call on an
  engine with a slot per prompt: each row ends at its own stop id, not the slowest row's."""
  settings = llm.GenerationSettings.for_model(model, max_new_tokens, llm.GREEDY)
  config = config_for_rows(prompts, max_new_tokens, model.config.max_position_embeddings)
  return Engine(model, config).generate(prompts, settings, rng=jax.random.key(0))


def executor_metrics(trajectories, examples) -> dict:
  turns = [t["text"] for tr in trajectories for t in tr.info["turns"]]
  valid = sum(not isinstance(parse_turn(t), FormatError) for t in turns)
  searched = [tr.stats.get("tool_calls", 0) > 0 for tr in trajectories]
  answered = [tr.answer is not None for tr in trajectories]
  scores = metrics.evaluate({e.id: tr.answer for e, tr in zip(examples, trajectories)
                             if tr.answer is not None}, examples)
  ends = collections.Counter(k for tr in trajectories for k in tr.stats if k.startswith("end_"))
  return {"runs": len(trajectories), "turns": len(turns),
          "format_valid": valid / max(len(turns), 1),
          "search_then_answer": sum(s and a for s, a in zip(searched, answered)) / len(examples),
          "answered": sum(answered) / len(examples), "em": scores["em"], "f1": scores["f1"],
          "ends": dict(ends)}


def apex_metrics(model, world_seed: int, questions: int, topk: int, search: str = "word",
                 prompts: str = "compact") -> dict:
  world = World.generate(world_seed, 120, questions)
  examples = world.examples[:questions]
  config = AgentConfig(prompts=prompts, temperature=0.0, topk=topk, max_turns=5,
                       max_llm_calls=10, executor_max_new_tokens=96, planner_max_new_tokens=96,
                       max_context_tokens=model.config.max_position_embeddings)
  generator = SeparateGenerator({m: (model, None, None) for m in ("planner", "executor")})
  searcher = (WordSearch if search == "word" else NgramSearch)(world.passages, topk)
  executor, planner = Executor(generator, searcher, config), Planner(generator, config)
  qs, rng = [e.question for e in examples], jax.random.key(0)
  alone = executor.run(qs, rng=rng)
  runs = planner.plan(qs, [None] * len(qs), rng=rng)
  guided = executor.run(qs, [r.plan for r in runs], rng=rng)
  decisions = planner.evaluate(runs, guided, rng=rng)
  n = len(qs)
  return {"executor": executor_metrics(alone, examples),
          "planner": {"plan_nonempty": sum(bool(r.plan.strip()) for r in runs) / n,
                      "decision_parsed": sum(d.parsed for d in decisions) / n,
                      "decision_exact": sum(d.exact for d in decisions) / n,
                      "replan": sum(d.replan for d in decisions) / n,
                      "format_ok": sum(planner.format_ok(r) for r in runs) / n},
          "executor_with_plan": executor_metrics(guided, examples),
          "samples": {"question": qs[0], "executor": alone[0].info["messages"][1:],
                      "plan": runs[0].conv.messages[2:]}}


def reading_metrics(model, world_seed: int, questions: int, topk: int,
                    prompts: str = "compact", spaced: bool = False) -> dict:
  """The executor reading its gold passages (`reading.reading_prompts` on a fresh world,
  WordSearch as the corpus is built), each reply generated greedily. hop_query: the next search's query equals
  the gold hop's (it names the fact just read); answer_em: the final <answer> is right
  (datasets.metrics EM) over the gold runs, by hop count; answer_em_any: over every question
  (a question whose search misses its gold passage counts as wrong)."""
  world = World.generate(world_seed, 120, questions)
  examples = world.examples[:questions]
  rows = reading.reading_prompts(examples, WordSearch(world.passages, topk),
                         AgentConfig(prompts=prompts, topk=topk), model.tokenizer, spaced)
  out = greedy_replies(model, [r[0] for r in rows], 96)
  query_ok, answers, by_hops, samples = [], {}, collections.defaultdict(list), []
  for i, (_, kind, gold, ex) in enumerate(rows):
    text = model.tokenizer.decode([int(x) for x in out.tokens[i, :int(out.lengths[i])]])
    turn = parse_turn(text)
    if kind == "query":
      query_ok.append(isinstance(turn, ToolCall)
                      and [q.strip() for q in turn.queries] == [gold])
      continue
    answer = turn.text if isinstance(turn, Answer) else None
    answers[ex.id] = answer
    em = answer is not None and metrics.evaluate({ex.id: answer}, [ex])["em"] == 1.0
    by_hops[ex.hops].append(em)
    if not em and len(samples) < 6:
      samples.append({"question": ex.question, "gold": gold, "reply": text})
  scored = {i: a for i, a in answers.items() if a is not None}
  n_answer = sum(map(len, by_hops.values()))
  return {"questions": len(examples), "gold_runs": n_answer,
          "hop_query": sum(query_ok) / max(len(query_ok), 1), "hop_queries": len(query_ok),
          "answer_em": sum(sum(v) for v in by_hops.values()) / max(n_answer, 1),
          "answer_em_any": metrics.evaluate(scored, examples)["em"],
          "answer_em_by_hops": {h: round(sum(v) / len(v), 3) for h, v in sorted(by_hops.items())},
          "wrong_samples": samples}


def distiller_metrics(model, world_seed: int, questions: int, topk: int,
                      max_new_tokens: int = 400, prompts: str = "compact") -> dict:
  config = AgentConfig(prompts=prompts, topk=topk)
  turns, _ = build.world_turns(World.generate(world_seed, 120, questions), config)
  turns = [t for t in turns if t["role"] == "apex_distill" and "memory_ids" in t]
  if not turns:
    return {"prompts": 0}
  prompts = [model.tokenizer.apply_chat_template(t["messages"], add_generation_prompt=True)
             for t in turns]
  out = greedy_replies(model, prompts, max_new_tokens)
  kinds, texts, dropped, with_dropped = collections.Counter(), [], 0, 0
  overwrites, with_overwrites = 0, 0
  for i, t in enumerate(turns):
    text = model.tokenizer.decode([int(x) for x in out.tokens[i, :int(out.lengths[i])]])
    texts.append(text)
    try:
      parsed = skills.parse_reply(text, Bucket(*t["bucket"]),
                                  {str(m): m for m in t["memory_ids"]}, t["has_skill"])
      kinds["valid"] += 1
      dropped, with_dropped = dropped + len(parsed.dropped), with_dropped + bool(parsed.dropped)
      overwrites += len(parsed.overwritten)
      with_overwrites += bool(parsed.overwritten)
    except skills.DistillerError as e:
      kinds[e.kind] += 1
  n, applied = len(turns), kinds.pop("valid", 0)
  return {"prompts": n, "synthesis": sum(not t["has_skill"] for t in turns),
          "reply_tokens_max": int(out.lengths[:n].max()),
          "applied": applied, "valid": applied / n, "errors": dict(kinds),
          "unknown_absorbed_ids": dropped, "applied_with_unknown_absorbed_ids": with_dropped,
          "bucket_overwrites": overwrites, "applied_with_bucket_overwrites": with_overwrites,
          "reply_tokens_mean": float(out.lengths[:n].mean()), "sample": texts[0]}


def morse_metrics(model, problems: int) -> dict:
  family = synthetic.Synthetic()
  probs = synthetic.generate(problems, 12345, synthetic.train_categories())
  turns = [t for t in corpus.turns(probs) if t["role"] == "execute"]
  prompts = [model.tokenizer.apply_chat_template(t["messages"], add_generation_prompt=True)
             for t in turns]
  out = greedy_replies(model, prompts, 320)
  by_id, passed = {p.id: p for p in probs}, 0
  for i, t in enumerate(turns):
    problem = by_id[t["problem_id"]]
    text = model.tokenizer.decode([int(x) for x in out.tokens[i, :int(out.lengths[i])]])
    node = next(n for n in problem.gold_graph if str(n["id"]) == t["node_id"])
    upstream = {a: synthetic.reference_artifact(problem, a)
                for a in synthetic._ancestors(problem, t["node_id"])}
    passed += family.score_node(problem, node, text, upstream).passed
  return {"nodes": len(turns), "node_pass": passed / max(len(turns), 1)}


def main(argv):
  f = flags.FLAGS
  del argv
  start = time.time()
  model = llm.load(f.model)
  result = {"model": f.model, "world_seed": f.world_seed, "search": f.search,
            "prompts": f.prompts}
  if f.reading:
    result["reading"] = reading_metrics(model, f.world_seed, f.questions, f.topk,
                                        f.prompts, f.spaced_copies)
    print(json.dumps({k: v for k, v in result["reading"].items() if k != "wrong_samples"}),
          flush=True)
    if f.reading == "only":
      print(json.dumps(result["reading"]["wrong_samples"], indent=1), flush=True)
      return
  result["apex"] = apex_metrics(model, f.world_seed, f.questions, f.topk,
                                f.search, f.prompts)
  print(json.dumps({k: v for k, v in result["apex"].items() if k != "samples"}), flush=True)
  if f.distill_max_new_tokens:
    result["distiller"] = distiller_metrics(model, f.world_seed, f.distill_questions,
                                            f.topk, f.distill_max_new_tokens, f.prompts)
    print(json.dumps({k: v for k, v in result["distiller"].items() if k != "sample"}),
          flush=True)
  if f.judge_runs:
    result["judges"] = judge_metrics(model, f.world_seed, f.distill_questions,
                                     f.topk, f.judge_runs)
    print(json.dumps(result["judges"]), flush=True)
  if f.morse_problems:
    result["morse"] = morse_metrics(model, f.morse_problems)
    print(json.dumps(result["morse"]), flush=True)
  result["seconds"] = round(time.time() - start, 1)
  if f.out:
    with open(f.out, "w") as out:
      json.dump(result, out, indent=1, default=str)


if __name__ == "__main__":
  define_flags()
  app.run(main)
