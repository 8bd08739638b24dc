"""The phases of an APEx experiment (`apex_jax.experiment` builds its pieces): the memory
warm-up, the three stages, TTRL, the evaluations and the ablation table.

  exp = build(config)                        # data, search, bank, generator, updater, agents
  memory_build(exp, rng=key)                 # the untrained system's episodes -> memories, skills
  result = run_stages(exp.updater, exp.experts, stages(exp), exp.generator, rng=key)
  scores = evaluate(exp, result.experts, "test", use_memories=True, use_skills=True)
  run(config)                                # all of it, metrics in <workdir>/results.json

The ablation rows (which exist, what each turns off) are `apex_jax.ablations`; `ablations`
here evaluates them. Pieces that need a model run in `apex_jax.training.rollouts`; this module
only wires them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax

from morse_jax.config_sections import settings

from apex_jax import baselines, plots
from apex_jax.ablations import (ABLATIONS, AblationInputs, ablation_names, ablation_system,
                                rebuilt_module_rows, row_module, untrained_module)
from apex_jax.agents import Distiller, Executor, Planner
from apex_jax.agents.episode import run_episode
from apex_jax.agents.generator import with_experts
from apex_jax.datasets import image_qa
from apex_jax.experiment import (JUDGES, Experiment, StagePhase, TtrlPhase, agents_for, build,
                                  choice)
from apex_jax.memory import CATEGORIES, MODALITIES, Bucket, MemoryBank
from apex_jax.memory.consolidation import Judged, consolidate, count_evolutions
from apex_jax.row_scores import Outcome, bank_counts, batches, eval_examples, row_scores
from apex_jax.training import judging, rollouts
from apex_jax.training.accuracy import AccuracyItem
from apex_jax.training.grpo import FrozenUpdater
from apex_jax.training.stages import STAGE_ORDER, Stage, run_stages
from apex_jax.training.ttrl import JudgeBackends, Query, run_ttrl
from morse_jax import runtime
from morse_jax.checkpoint import phase
from morse_jax.checkpoint.steps import files_fingerprint
from morse_jax.lora.export import export_peft


def memory_build(exp: Experiment, *, rng: jax.Array, snapshot: str | None = None) -> dict:
  """Runs the untrained system on `memory_build.questions` training questions, stores each
  episode's summarised workflow with its outcome, updates the shown memories' win rates, and
  lets the Distiller evolve every bucket that is due (all touched ones when
  `memory_build.force_evolve`), at `memory.evolve_temperature`; episodes and summaries at
  `memory_build.temperature` (None: the agents'). snapshot: a file to back the
  bank up to after the episodes and before the evolution (the ablations' one-pass bank).

  The outcome is judged as the authors' memory server records it: y2 scored by the stages'
  R_acc scorer (`judging.reward_accuracy`: config.judges.accuracy "judge", an LlmJudge on the
  experiment's judge backend with the rule metric for what it could not judge, or "rule", EM /
  F1 alone), and stored as a binary win: an episode is correct when its score is 1.0 (the
  judge's "correct", or the rule metric's full match; a partial F1 is not a win, as the paper's
  win rates count wins). stats: judge_calls / judge_fallbacks (answers sent to the judge, and of
  those scored by the rule; both 0 under "rule")."""
  c = exp.config.memory_build
  agents = exp.memory_build_agents()
  planner, executor = Planner(exp.generator, agents), exp.executor(agents)
  distiller = Distiller(exp.generator, agents)
  evolver = Distiller(exp.generator, exp.evolving_agents())
  scorer = judging.reward_accuracy(exp)
  stats = dict(episodes=0, correct=0, memories_stored=0, evolutions_applied=0,
               evolutions_failed=0, unknown_absorbed_ids=0, bucket_overwrites=0, judge_calls=0,
               judge_fallbacks=0)
  touched = []
  rng, k_evolve = jax.random.split(rng)
  for i, batch in enumerate(batches(exp.train[:c.questions], c.batch_size)):
    k_episode, k_remember = jax.random.split(jax.random.fold_in(rng, i))
    episodes = run_episode(planner, executor, [ex.question for ex in batch], rng=k_episode,
                           bank=exp.bank, categories=[ex.category for ex in batch],
                           **image_qa.episode_inputs(batch))
    scores = scorer.score_many([AccuracyItem(ex.question, ep.y2, tuple(ex.answers))
                                for ep, ex in zip(episodes, batch)])
    correct = [score >= 1.0 for score in scores]
    for key in ("judge_calls", "judge_fallbacks"):
      stats[key] += int(scorer.metrics.get(key, 0))
    _, memories = distiller.workflow_memories(episodes, correct, rng=k_remember)
    consolidate(exp.bank, [Judged(m, ok, ep.memory_ids)
                           for m, ok, ep in zip(memories, correct, episodes)], stats)
    stats["episodes"] += len(episodes)
    stats["correct"] += sum(correct)
    touched += [ep.bucket for ep in episodes]
  if snapshot is not None:
    exp.bank.backup(snapshot)
  count_evolutions(stats, (e.result for e in evolver.evolve(exp.bank, touched, rng=k_evolve,
                                                            force=c.force_evolve)))
  stats["skills"] = sum(exp.bank.get_skill(b) is not None for b in memory_buckets(exp.bank))
  return stats


# The name of the module memory building was first written in, and a version: 2 since a failed
# episode's memory starts at win rate 0 (a version-1 snapshot holds such memories at 1), so an
# earlier snapshot is refused rather than resumed with other win rates.
_MEMORY_BUILD_FORMAT = "apex_jax.experiment/memory_build/2"


def memory_build_identity(c) -> dict:
  """What memory building depends on: a snapshot taken under another is not this run's."""
  parts = ("seed", "model", "data", "search", "memory", "memory_build", "agents", "lora")
  out = {k: c.to_dict()[k] if hasattr(c, "to_dict") else c[k] for k in parts if k in c}
  if "data" in out:  # procedures and the image keys left out when off, so a snapshot of a
    # config without them keeps its identity
    off = {"procedures"} if not out["data"].get("procedures", True) else set()
    off |= {"image_share"} if not out["data"].get("image_share", 1) else set()
    out["data"] = {k: v for k, v in out["data"].items() if k not in off}
    if out["data"].get("image_share") and "image_search" in c:  # the tool shapes the episodes
      out["image_search"] = c.image_search.to_dict()
  bank = out.get("memory", {}).get("bank", {})
  if bank.get("text_image") is True:  # the default, as every snapshot before the switch
    out["memory"]["bank"] = {k: v for k, v in bank.items() if k != "text_image"}
  out["base_weights"] = files_fingerprint(c.model.path)  # names, sizes, bytes (edges if big)
  scorer = outcome_scorer_identity(c)
  if scorer is not None:  # absent for EM, the scorer of the snapshots before it was a choice
    out["outcome_scorer"] = scorer
  return json.loads(json.dumps(out, sort_keys=True, default=str))


def outcome_scorer_identity(c) -> dict | None:
  """The settings memory building's outcome scorer reads (config.judges: accuracy, rule and,
  with the judge, its backend and reply cap), or None for the rule "em": the outcome every
  snapshot written before the scorer was configurable was scored by, so theirs stay valid."""
  j = c.get("judges") or {}
  j = j.to_dict() if hasattr(j, "to_dict") else dict(j)
  accuracy, metric = judging.accuracy_choice(j)
  if accuracy == "rule":
    return None if metric == "em" else {"accuracy": "rule", "rule": metric}
  keys = ("kind", "path", "dtype", "url", "model", "max_tokens")
  return {"accuracy": accuracy, "rule": metric, **{k: j[k] for k in keys if k in j}}


def resumable_memory_build(exp: Experiment, *, rng: jax.Array, directory: str,
                           continue_other_run: bool = False, snapshot: str | None = None) -> dict:
  """memory_build, once per run (`checkpoint.phase`: it writes to the bank, so a restart puts
  back the bank snapshot `<directory>/memory_build.db` committed after it and returns its stats
  from `<directory>/memory_build.json`). The stages only read the bank, so it is also where a
  run killed in the stages (or before TTRL's first checkpoint) resumes from. A damaged snapshot
  is an error; so is one of other settings, unless `continue_other_run`
  (config.train.continue_other_run: then it is used, with a note).
  snapshot: memory_build's one-pass bank copy (the w/o-iteration ablation), kept from the run's
  first attempt."""
  identity = memory_build_identity(exp.config)
  stats = phase.resume(directory, "memory_build", format_=_MEMORY_BUILD_FORMAT,
                       identity=identity, store=exp.bank,
                       continue_other_run=continue_other_run, label="[apex] ")
  if stats is not None:
    return stats
  stats = memory_build(exp, rng=rng, snapshot=snapshot)
  phase.commit(directory, "memory_build", format_=_MEMORY_BUILD_FORMAT, identity=identity,
               store=exp.bank, result=stats)
  return stats


def memory_buckets(bank: MemoryBank, minimum: int = 1) -> list[Bucket]:
  """Every bucket holding at least `minimum` memories: the distiller stage's inputs."""
  return [Bucket(cat, mod) for cat in CATEGORIES for mod in MODALITIES
          if bank.count(Bucket(cat, mod)) >= minimum]


def evaluate(exp: Experiment, experts, split: str = "test", *, use_memories: bool = True,
             use_skills: bool = True, rng: jax.Array | None = None,
             bank: MemoryBank | None = None) -> dict:
  """EM / F1 (overall, per category, per hop count) of whole episodes on `split`'s first
  `eval.questions` questions, sampled at `eval.temperature` (0: greedy), reading `bank` (else the
  experiment's; read only: evaluation stores nothing) through `MemoryBank.planner_context`'s
  use_memories / use_skills. Also `answered` (the share with a final answer),
  `context_tokens` (per episode, the tokens of every conversation it ran: the planner's and each
  executor run's, prompts, generations and tool output) and `memory_context_tokens` (per
  episode, the planner context E(q): skill document + memories, as the planner tokenises it)."""
  examples = eval_examples(exp, split)
  c = exp.config.eval
  agents = dataclasses.replace(exp.agents, temperature=c.temperature)
  generator = with_experts(exp.generator, experts)  # exp.generator is left as it is
  bank = exp.bank if bank is None else bank
  bank = bank if use_memories or use_skills else None
  tokenizer = generator.tokenizer_of("planner")
  rng = jax.random.PRNGKey(exp.config.seed) if rng is None else rng
  outcomes = []
  for i, batch in enumerate(batches(examples, c.batch_size)):
    episodes = run_episode(Planner(generator, agents),
                           Executor(generator, exp.searcher, agents,
                                    image_search=exp.image_search),
                           [ex.question for ex in batch], rng=jax.random.fold_in(rng, i),
                           bank=bank, categories=[ex.category for ex in batch],
                           use_memories=use_memories, use_skills=use_skills,
                           **image_qa.episode_inputs(batch))
    outcomes += [episode_outcome(ep, tokenizer, None if ep.context is None else ep.context.text)
                 for ep in episodes]
  return row_scores(examples, outcomes)


def episode_outcome(ep, tokenizer, memory_text: str | None) -> Outcome:
  """A planner-executor episode's row entry: its answer y2, every conversation's tokens and
  those of `memory_text` (what its planner was shown; None: nothing)."""
  return Outcome(ep.y2, ep.planner.total_tokens() + sum(t.total_tokens() for t in ep.executor),
                 0 if memory_text is None else
                 len(tokenizer.encode(memory_text, add_special_tokens=False)))


def ablations(exp: Experiment, inputs: AblationInputs, names=ABLATIONS, *,
              rng: jax.Array | None = None) -> dict[str, dict]:
  """One `evaluate` per row (`apex_jax.ablations`), all with the same key; each row also names
  the bank it read (`bank`: memories, skills, the snapshot file or "live")."""
  rows, opened = {}, {}
  try:
    for name in names:
      experts, path, memories, skills = ablation_system(name, inputs, exp.updater.lora)
      if path is not None and path not in opened:
        opened[path] = MemoryBank(path, exp.bank.embedder, config=exp.bank.config)
      bank = exp.bank if path is None else opened[path]
      rows[name] = evaluate(exp, experts, use_memories=memories, use_skills=skills, rng=rng,
                            bank=bank)
      rows[name]["bank"] = {"path": path or "live", **bank_counts(bank)}
  finally:
    for bank in opened.values():
      bank.close()
  return rows


def stages(exp: Experiment) -> list[Stage]:
  """The stages in the paper's order (executor, distiller, planner); a module with steps 0 is
  left out. The distiller trains on the buckets memory_build filled."""
  out = []
  for module in STAGE_ORDER:
    phase = settings(StagePhase, exp.config.stages[module], f"stages.{module}", module=module)
    if not phase.runs:
      continue
    agents = agents_for(exp, phase, f"stages.{module}")
    if module == "executor":
      data, fn = exp.train, rollouts.ExecutorRollout(exp.searcher, exp.bank, agents,
                                                     accuracy=judging.reward_accuracy(exp),
                                                     image_search=exp.image_search)
    elif module == "planner":
      data, fn = exp.train, rollouts.PlannerRollout(exp.searcher, exp.bank, agents,
                                                    accuracy=judging.reward_accuracy(exp),
                                                    image_search=exp.image_search)
    else:
      data, fn = memory_buckets(exp.bank), rollouts.DistillerRollout(
          exp.bank, agents, skill_judge=judging.skill_judge(exp),
          term_judges=judging.skill_term_judges(exp))
      if not data:
        raise ValueError("the distiller stage has no bucket with memories: run memory_build "
                         "first (config.memory_build.questions > 0)")
    out.append(Stage(phase.stage(len(data)), data, fn))
  return out


def judges(exp: Experiment) -> JudgeBackends:
  """TTRL's no-ground-truth panel and skill-alignment judge on one chat backend: the backbone
  itself in process (bare, as the authors serve a separate judge model), or an HTTP server."""
  choice(exp.config.judges.kind, "judges.kind", JUDGES)
  return judging.judge_panel(judging.judge_chat(exp), exp.config.judges.max_tokens)


def judge_failures(panel: JudgeBackends, ttrl) -> dict:
  """Replies the judges could not parse (scored by their fallbacks), then calls that failed."""
  return {"evaluator": panel.nogt.evaluator_failures.snapshot(),
          "arbiter": panel.nogt.arbiter_failures.snapshot(),
          "align": panel.align.failures.snapshot(), "calls": dict(ttrl.judge_failures)}


def ttrl_phase(exp: Experiment, experts, bank: MemoryBank, panel: JudgeBackends, *,
               rng: jax.Array, logdir: str, checkpoint_dir: str,
               continue_other_run: bool = False, frozen: bool = False):
  """config.ttrl on the test questions (answers unused), reading and growing `bank`, with
  `experts` for every module (its episodes, summaries and evolution run on them). frozen: the
  planner is not updated (FrozenUpdater): the bank grows as that system's TTRL would grow it."""
  t = settings(TtrlPhase, exp.config.ttrl, "ttrl")
  queries = [Query(ex.question, ex.caption, category=ex.category, data_id=ex.id,
                   images=tuple(ex.images[:1])) for ex in exp.test]
  updater = exp.updater
  if frozen:
    updater = FrozenUpdater.of(updater)
  return run_ttrl(updater, experts, queries, bank, exp.generator,
                  rollouts.TtrlEpisodes(exp.searcher, bank, agents_for(exp, t, "ttrl"),
                                        t.summarize, image_search=exp.image_search),
                  panel, None, evolve_fn=rollouts.evolve_with(exp.evolving_agents()),
                  config=t.ttrl(len(queries)), rng=rng, logdir=logdir,
                  checkpoint_dir=checkpoint_dir, checkpoint_every=t.checkpoint_every,
                  continue_other_run=continue_other_run)


def run(config) -> dict:
  """build -> memory_build -> stages -> TTRL on the test questions (answers unused) -> the
  ablation table, with the untrained system (initial experts, the built memories) as the first
  row (unless config.eval.untrained is False), each without_<module>_training row on its own
  TTRL rerun (`rebuilt_module_rows`: histories in results["ablation_ttrl"], banks under
  <workdir>/banks, checkpoints under <workdir>/checkpoints/ttrl_<row>), then the comparison
  systems of config.eval.baselines (`apex_jax.baselines.baseline_rows`: each on the initial
  experts, a memory system on its own bank <workdir>/banks/baseline_<name>.db); stages with
  steps 0 and TTRL with steps 0 are left out (none at all: the experts stay the initial ones);
  everything in <workdir>/results.json, curves under <workdir>/logs and in
  <workdir>/rewards.png, the ablations' bank snapshots in <workdir>/banks, seconds per phase in
  results["seconds"].

  Resumable: under <workdir>/checkpoints, memory building leaves a bank snapshot
  (`resumable_memory_build`), the stages a checkpoint every `train.checkpoint_every` updates
  (0: at each stage's end) and TTRL one every `ttrl.checkpoint_every` steps with the bank's
  snapshot (default 1 for both). Run again with the same config and workdir after a kill, it
  skips what was finished and repeats the unbroken run's metrics step for step; the
  evaluations are rerun (they only read). A workdir whose checkpoints another config wrote is
  refused (unless train.continue_other_run); remove <workdir>/checkpoints to start afresh."""
  runtime.use_cpu_threads(config)  # before the backend starts: the bits, whatever the cores
  # seeds run one after the other (or in spawned workers) reuse the sampler and update
  # programs the first compiled: 105 s of a seed's 456 s are compilation (docs/RESULTS.md)
  runtime.use_compilation_cache(config)
  systems = baselines.baseline_names(config)  # checked before anything runs
  exp = build(config)
  rng = jax.random.PRNGKey(config.seed)
  k_mem, k_stages, k_ttrl, k_eval = jax.random.split(rng, 4)
  r = _Run(exp, config)
  names = ablation_names(config)
  one_pass = r.bank_file("one_pass") if "without_iteration" in names else None
  r.results.update(memory_build=resumable_memory_build(exp, rng=k_mem, directory=r.checkpoints,
                                                       continue_other_run=r.other,
                                                       snapshot=one_pass),
                   seconds=r.seconds, runtime=runtime.describe())
  r.lap("memory_build")
  untrained = _untrained_row(r, k_eval)
  experts = _after_stages(r, k_stages)
  before_ttrl = (exp.bank.backup(r.bank_file("before_ttrl"))
                 if "without_ttrl" in names else None)
  row_banks = {name: exp.bank.backup(r.bank_file(name))
               for name in rebuilt_module_rows(config, names)}
  experts_ttrl = _after_ttrl(r, experts, k_ttrl)
  rebuilt = _module_rows(r, experts, row_banks, k_ttrl)
  r.results["eval"] = {**untrained, **ablations(
      exp, AblationInputs(exp.experts, experts, experts_ttrl, one_pass, before_ttrl, rebuilt),
      names, rng=k_eval)}
  r.lap("eval")
  if systems:
    r.results["eval"].update(baselines.baseline_rows(exp, systems, rng=k_eval,
                                                     workdir=config.workdir))
    r.lap("eval_baselines")
  _write_results(r, experts_ttrl)
  return r.results


@dataclasses.dataclass
class _Run:
  """What the phases of one `run` share: the experiment, the folders under config.workdir, the
  results so far and the seconds per phase."""

  exp: Experiment
  config: Any  # the ConfigDict run was given
  results: dict = dataclasses.field(default_factory=dict)
  seconds: dict = dataclasses.field(default_factory=dict)
  clock: float = dataclasses.field(default_factory=time.time)

  @property
  def logdir(self) -> str:
    return os.path.join(self.config.workdir, "logs")

  @property
  def checkpoints(self) -> str:  # a restarted run resumes from them
    return os.path.join(self.config.workdir, "checkpoints")

  @property
  def other(self) -> bool:  # config.train.continue_other_run
    return self.exp.training.continue_other_run

  def bank_file(self, name: str) -> str:
    return os.path.join(self.config.workdir, "banks", f"{name}.db")

  def lap(self, name: str) -> None:
    """The seconds since the last lap, as phase `name`'s."""
    self.seconds[name] = round(time.time() - self.clock, 1)
    self.clock = time.time()
    print(f"[apex] {name}: {self.seconds[name]:.0f}s", flush=True)


def _untrained_row(r: _Run, rng: jax.Array) -> dict:
  """{"untrained": the untrained system's row} (the initial experts, the bank as memory building
  left it), or {} when config.eval.untrained is False (e.g. no stage, no TTRL: it equals full)."""
  if not r.config.eval.get("untrained", True):
    return {}
  row = evaluate(r.exp, r.exp.experts, rng=rng)
  row["bank"] = {"path": "live", **bank_counts(r.exp.bank)}
  r.lap("eval_untrained")
  return {"untrained": row}


def _after_stages(r: _Run, rng: jax.Array):
  """The experts after the stages (every stage at steps 0: the initial ones)."""
  exp = r.exp
  stage_list = stages(exp)
  if not stage_list:
    r.results["stages"] = []
    return exp.experts
  staged = run_stages(exp.updater, exp.experts, stage_list, exp.generator, rng=rng,
                      logdir=r.logdir, checkpoint_dir=os.path.join(r.checkpoints, "stages"),
                      checkpoint_every=exp.training.checkpoint_every,
                      continue_other_run=r.other)
  r.results["stages"] = staged.history
  r.lap("stages")
  return staged.experts


def _after_ttrl(r: _Run, experts, rng: jax.Array):
  """The experts after TTRL from `experts` on the live bank (TTRL at steps 0: `experts`)."""
  t = r.config.ttrl
  if not (t.steps or t.get("epochs")):
    return experts
  panel = judges(r.exp)
  ttrl = ttrl_phase(r.exp, experts, r.exp.bank, panel, rng=rng, logdir=r.logdir,
                    checkpoint_dir=os.path.join(r.checkpoints, "ttrl"), continue_other_run=r.other)
  r.results["ttrl"] = ttrl.history
  r.results["judge_failures"] = judge_failures(panel, ttrl)
  r.lap("ttrl")
  return ttrl.experts


def _module_rows(r: _Run, experts, row_banks: dict[str, str], rng: jax.Array) -> dict:
  """TTRL rerun for each rebuilt without_<module>_training row (`rebuilt_module_rows`) from the
  staged `experts` with that module's initial adapter, on the row's bank copy, each with its own
  checkpoints and curves: row -> (its experts, its bank file)."""
  exp, rebuilt = r.exp, {}
  for name, path in row_banks.items():
    module = row_module(name)
    row_bank = MemoryBank(path, exp.bank.embedder, config=exp.bank.config)
    try:
      panel = judges(exp)
      row = ttrl_phase(exp, untrained_module(experts, exp.experts, exp.updater.lora, module),
                       row_bank, panel, rng=rng, logdir=os.path.join(r.logdir, name),
                       checkpoint_dir=os.path.join(r.checkpoints, f"ttrl_{name}"),
                       continue_other_run=r.other, frozen=module == "planner")
    finally:
      row_bank.close()
    r.results.setdefault("ablation_ttrl", {})[name] = {
        "history": row.history, "judge_failures": judge_failures(panel, row)}
    rebuilt[name] = (row.experts, path)
  if rebuilt:
    r.lap("ablation_ttrl")
  return rebuilt


def _write_results(r: _Run, experts) -> None:
  """The bank's counters, `experts` exported, the reward plot and <workdir>/results.json; the
  bank closed."""
  exp, results, workdir = r.exp, r.results, r.config.workdir
  results["distiller_errors"] = dict(exp.bank.distiller_errors)
  results["unknown_absorbed_ids"] = exp.bank.unknown_absorbed_ids  # dropped, replies applied
  results["bucket_overwrites"] = exp.bank.bucket_overwrites  # category / modality, replies applied
  results["adapters"] = export_adapters(exp, experts, os.path.join(workdir, "adapters"))
  try:
    evals = results["eval"]
    held_out = {"label": "held-out F1", "before": evals.get("untrained", {}).get("f1"),
                "after": evals.get("full", {}).get("f1")}
    results["plot"] = plots.reward_curves(r.logdir, os.path.join(workdir, "rewards.png"),
                                          held_out=held_out)
  except ValueError as e:  # no stage logged a reward: nothing to draw, say so in the results
    results["plot"] = f"not drawn: {e}"
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2, sort_keys=True)
  exp.bank.close()


def export_adapters(exp: Experiment, experts, directory: str) -> dict[str, str]:
  """Each module's role expert as a PEFT LoRA folder `<directory>/<module>`, which
  `launchers.serve --lora_modules=<module>=<folder>` (or vLLM, or peft) serves."""
  lora, out = exp.updater.lora, {}
  for role in lora.roles:
    out[role] = os.path.join(directory, role)
    export_peft(experts, lora, exp.model.config, [lora.role_index(role)], out[role],
                base_model=exp.config.model.path)
  return out


def print_summary(results: dict, workdir: str) -> None:
  """The run as a user reads it: memory building, each stage's reward (first and last updates,
  skipped updates), TTRL, the ablation table, the plot and the time per phase."""
  print(f"\nmemory build: {results['memory_build']}")
  rows = results["stages"] + [{"module": "ttrl", **r} for r in results.get("ttrl", [])]
  for module in dict.fromkeys(r["module"] for r in rows):
    rewards = [r.get("reward_mean", float("nan")) for r in rows if r["module"] == module]
    skipped = sum(r.get("skipped", 0) for r in rows if r["module"] == module)
    line = f"{module:<10} {len(rewards)} updates ({skipped:.0f} skipped: flat rewards); "
    if len(rewards) < 2:
      print(line + f"mean reward {rewards[0]:.3f}")
      continue
    half = len(rewards) // 2
    print(line + f"mean reward first half {sum(rewards[:half]) / half:.3f}, last half "
          f"{sum(rewards[half:]) / (len(rewards) - half):.3f}")
  if results.get("judge_failures"):
    print(f"TTRL judge failures (counted; scored by the judges' fallbacks): "
          f"{results['judge_failures']}")
  print("\nablations (held-out questions; context: tokens per episode, all conversations / "
        "the planner's memory context E(q); bank: memories / skills it held)")
  print(ablation_table(results["eval"]))
  print(f"\nreward curves: {results.get('plot')}\nresults: {workdir}/results.json; seconds: "
        f"{results.get('seconds')}\ntrained experts as PEFT adapters (launchers.serve "
        f"--lora_modules=NAME=DIR): {results.get('adapters')}")


def ablation_table(rows: dict) -> str:
  """The ablation rows as a text table: system, EM, F1, answered, context tokens per episode
  (all conversations, and the planner's memory context), the bank's memories / skills."""
  def num(row, key, fmt):
    value = row.get(key)
    return "-" if value is None else format(value, fmt)

  lines = [f"{'system':<28} {'EM':>6} {'F1':>6} {'answered':>9} {'context':>9} {'E(q)':>7} "
           f"{'bank':>7}"]
  for name, row in rows.items():
    bank = row.get("bank")
    bank = f"{bank['memories']}/{bank['skills']}" if bank else "-"
    lines.append(f"{name:<28} {row['em']:>6.3f} {row['f1']:>6.3f} "
                 f"{num(row, 'answered', '.3f'):>9} {num(row, 'context_tokens', '.1f'):>9} "
                 f"{num(row, 'memory_context_tokens', '.1f'):>7} {bank:>7}")
  return "\n".join(lines)
