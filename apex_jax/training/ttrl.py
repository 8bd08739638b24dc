"""Skill-guided test-time RL (APEx): planner-only online GRPO on unlabeled queries.

Per batch (J-Ding519/APEx TTRL/TTRL-nogt/local_search/mmsearch_skill.py `compute_score`, and the
memory server it posts to):
1. each query's planner context E(q) from the MemoryBank (skill if confident + memories);
2. G planner episodes per query (plan -> executor -> decide -> maybe replan), from `episode_fn`;
3. each episode judged without ground truth: arbiter in [0, 1] (correct when >= 0.5), skill
   alignment of its plan when the planner was shown the bucket's skill (gamma > the bank's
   skill_min_gamma, 0.1) and it has a procedure or pitfalls; a skill the planner never saw
   neither enters the reward nor costs a judge call (counted: unshown_skill_groups);
     R = (1 - l_s) (0.9 arbiter + 0.1 format) + l_s align,   l_s = 0.1 w min(n / 10, 1);
   with the hard skill gate on (off by default, as the authors'), a group whose skill passes
   `rewards.skill_gate` gets R = confidence for every episode: zero advantage, update skipped;
4. one GRPO update of the planner expert (executor and distiller frozen);
5. memories consolidated: every episode (`TtrlConfig.store` "all"; "best": only each query's
   highest-reward one; "majority": that of the group's majority answer, if it has one; "none")
   stored with its judged outcome, the win rates of the
   memories shown to it updated (the plan's, and the replan's when it replanned); every touched
   bucket due for evolution gets a Distiller reply applied.
A judge that fails or answers out of range is a counted failure with fallback 0 (the authors'
fallback for alignment; an unjudged answer is not counted correct), never a crash.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp

from morse_jax.checkpoint.steps import fingerprint
from morse_jax.rl.logprobs import scoring_temperature
from morse_jax.rl.run import Run, record
from morse_jax.rl.state import TrainState

from apex_jax.agents.generator import with_experts
from apex_jax.agents.trajectory import Trajectory
from apex_jax.judges.chat import JudgeError
from apex_jax.judges.rule import normalize_answer
from apex_jax.judges.nogt import Candidate
from apex_jax.memory import Bucket, Memory, MemoryBank, NewMemory, PlannerContext, Skill
from apex_jax.memory.consolidation import Judged, consolidate
from apex_jax.training import rewards as rw
from apex_jax.training.grpo import ModuleUpdater
from apex_jax.training.stages import phase_record

log = logging.getLogger(__name__)


STORE = ("all", "best", "majority", "none")


@dataclasses.dataclass(frozen=True)
class TtrlConfig:
  steps: int
  batch_size: int  # queries per update
  group_size: int  # planner episodes per query (G)
  learning_rate: float = 1e-6
  temperature: float = 1.0
  max_new_tokens: int = 256
  micro_batches: int = 0  # the update's (0: the updater's StepConfig.micro_batches; see StageConfig)
  base_lambda: float = 0.1  # l_s = base_lambda * skill confidence
  hard_gate: bool = False
  gate_threshold: float = 0.98
  gate_min_evidence: int = 20
  gate_require_procedure: bool = True
  # which judged episodes become memories: "all" (ours; every complete one) or "best" (per
  # query, the first complete episode with the group's highest reward: our reading of the
  # paper's "selected" episodes), "majority" (the best of the episodes giving the group's
  # majority answer, stored only when more than half of the complete episodes give it: the
  # self-consistency label of test-time RL without ground truth, Zuo et al. 2025, TTRL, for a
  # judge that calls nearly every run correct) or "none" (no memory: the bank keeps only what
  # memory building stored, with the win rates TTRL moves). Every episode's outcome moves its
  # shown memories' win rates.
  store: str = "all"

  def __post_init__(self):
    if self.store not in STORE:
      raise ValueError(f"TtrlConfig.store {self.store!r} not in {STORE}")
    for name in ("steps", "batch_size", "group_size", "max_new_tokens", "gate_min_evidence"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"TtrlConfig.{name} must be an int >= 1, got {value!r}")
    if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) \
        or self.micro_batches < 0:
      raise ValueError(f"TtrlConfig.micro_batches must be an int >= 0 (0: the StepConfig's), "
                       f"got {self.micro_batches!r}")
    if self.group_size < 2:
      raise ValueError(f"TtrlConfig.group_size must be >= 2, got {self.group_size!r}")
    if not self.learning_rate > 0 or not self.temperature >= 0:
      raise ValueError(f"TtrlConfig: learning_rate must be > 0 and temperature >= 0, got "
                       f"{self.learning_rate!r}, {self.temperature!r}")
    for name in ("base_lambda", "gate_threshold"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"TtrlConfig.{name} must be in [0, 1], got {getattr(self, name)!r}")


def _stored(store: str, complete: Sequence[int], rewards: Sequence[float],
            answers: Sequence[str]) -> set[int]:
  """The indices of a group's complete episodes that become memories (TtrlConfig.store)."""
  if store == "none" or not complete:
    return set()
  if store == "all":
    return set(complete)
  pool = complete
  if store == "majority":
    votes = collections.Counter(normalize_answer(answers[i]) for i in complete)
    answer, n = votes.most_common(1)[0]
    if 2 * n <= len(complete) or not answer:
      return set()
    pool = [i for i in complete if normalize_answer(answers[i]) == answer]
  return {max(pool, key=lambda i: (rewards[i], -i))}


@dataclasses.dataclass(frozen=True)
class Query:
  question: str
  caption: str | None = None
  category: str | None = None  # None: the bank's classifier routes it
  modality: str | None = None
  data_id: str | None = None  # the image-search cache's folder for the question's image
  images: tuple[str, ...] = ()  # the question's image as its example carries it (data URL)

  def identity(self) -> tuple:
    """What a checkpoint's run identity records of the query (a text query's as before images
    were carried, so its runs still resume)."""
    fields = (self.question, self.caption, self.category, self.modality, self.data_id)
    return fields + ((self.images,) if self.images else ())


@dataclasses.dataclass
class PlannerEpisode:
  trajectory: Trajectory  # the planner's turns (module "planner"), trained on
  plan: str  # the first plan, think block removed (judged for skill alignment)
  answer: str  # the final answer: y2 after a replan, else y1
  workflow: str  # the executor's trace: shown to the judges (and stored when no summary)
  format_score: float  # rewards.planner_format of the planner's turns
  complete: bool = True  # False: the episode broke before the decision -> reward 0, not stored
  replan_memory_ids: tuple[int, ...] = ()  # memories shown to its replan (their win rates too)
  summary: str | None = None  # the Distiller's workflow summary: stored as the memory


class Judges(Protocol):
  def arbiter(self, question: str, workflow: str, answer: str) -> float: ...

  def alignment(self, plan: str, skill: Skill) -> float: ...


@dataclasses.dataclass
class JudgeBackends:
  """`Judges` over the judges package: the no-GT panel (3 evaluators + arbiter; its `reward`,
  the arbiter's 1 / 0 by default) and the skill-alignment judge. Both count their own failures
  and return their configured fallbacks."""

  nogt: Any  # apex_jax.judges.nogt.NoGtJudge
  align: Any  # apex_jax.judges.align.AlignJudge

  def arbiter(self, question: str, workflow: str, answer: str) -> float:
    return self.nogt.judge(question, Candidate(answer, workflow)).reward

  def alignment(self, plan: str, skill: Skill) -> float:
    return self.align.score(plan, skill).score


EpisodeFn = Callable[[Sequence[Query], Sequence[PlannerContext], Any, jax.Array, TtrlConfig],
                     Sequence[Sequence[PlannerEpisode]]]
DistillFn = Callable[[Bucket, Sequence[Memory], Skill | None], str]  # -> the Distiller's reply
# evolve_fn(bank, buckets, generator, rng) -> the DistillerResults of the replies it applied
# itself to the buckets that were due (e.g. rollouts.evolve_with: Distiller.evolve)
EvolveFn = Callable[[MemoryBank, Sequence[Bucket], Any, jax.Array], Sequence[Any]]


@dataclasses.dataclass
class TtrlResult:
  experts: Any
  history: list[dict]
  judge_failures: collections.Counter


class _Judging:
  """Calls the judges, turning failures into counted fallbacks."""

  def __init__(self, judges: Judges):
    self.judges, self.failures = judges, collections.Counter()

  def _score(self, kind: str, call) -> float:
    try:
      value = call()
    except (JudgeError, ValueError, TypeError, ArithmeticError, RecursionError) as err:
      self.failures[f"{kind}_error"] += 1
      log.warning("%s judge failed (%s): %s", kind, type(err).__name__, err)
      return 0.0
    if isinstance(value, bool):
      return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
      self.failures[f"{kind}_bad_value"] += 1
      log.warning("%s judge returned %r, not a number in [0, 1]", kind, value)
      return 0.0
    return float(value)

  def arbiter(self, question, workflow, answer) -> float:
    return self._score("arbiter", lambda: self.judges.arbiter(question, workflow, answer))

  def alignment(self, plan, skill) -> float:
    return self._score("alignment", lambda: self.judges.alignment(plan, skill))


def _has_guidance(skill: Skill | None) -> bool:
  return skill is not None and bool(skill.procedure or skill.pitfalls)


def _group_rewards(episodes, query: Query, skill: Skill | None, conf: float, cfg: TtrlConfig,
                   judging: _Judging, stats: collections.Counter, n_full: int,
                   shown: Skill | None = None):
  """(rewards, judged outcomes) of one query's episodes; updates `stats`. skill: the bucket's
  (for the gate); shown: the skill the planner was shown (PlannerContext.skill), the only one
  its plan is judged against."""
  guided = _has_guidance(shown)
  stats["unshown_skill_groups"] += _has_guidance(skill) and not guided
  lam = rw.skill_lambda(shown.win_rate, shown.evidence_count, cfg.base_lambda, n_full) \
      if guided else 0.0
  gated = cfg.hard_gate and skill is not None and rw.skill_gate(
      conf, skill.evidence_count, bool(skill.procedure), threshold=cfg.gate_threshold,
      min_evidence=cfg.gate_min_evidence, require_procedure=cfg.gate_require_procedure)
  stats["gated_groups"] += gated
  out, outcomes = [], []
  for ep in episodes:
    if not ep.complete:
      stats["incomplete_episodes"] += 1
      out.append(conf if gated else 0.0)
      outcomes.append(None)
      continue
    arbiter = judging.arbiter(query.question, ep.workflow, ep.answer)
    outcomes.append(arbiter >= 0.5)
    if gated:  # the authors return the confidence before judging alignment
      out.append(conf)
      continue
    align = judging.alignment(ep.plan, shown) if guided else None
    reward = rw.ttrl_reward(arbiter, ep.format_score, alignment=align, lam=lam)
    stats["arbiter_sum"] += arbiter
    stats["align_sum"] += 0.0 if align is None else align
    stats["lambda_sum"] += lam
    stats["judged"] += 1
    out.append(reward.total)
  return out, outcomes


def _distill_due(bank: MemoryBank, buckets: Sequence[Bucket], distill_fn: DistillFn) -> list:
  """distill_fn's reply for each bucket due for evolution, applied: the DistillerResults."""
  results = []
  for bucket in dict.fromkeys(buckets):
    if bank.due_for_evolution(bucket):
      batch = bank.evolution_batch(bucket)
      reply = distill_fn(bucket, batch, bank.get_skill(bucket))
      results.append(bank.apply_distiller_reply(bucket, reply, batch=batch))
  return results


def run_ttrl(updater: ModuleUpdater, experts, queries: Sequence[Query], bank: MemoryBank,
             generator, episode_fn: EpisodeFn, judges: Judges, distill_fn: DistillFn | None, *,
             config: TtrlConfig, rng: jax.Array, logdir: str | None = None,
             evolve_fn: EvolveFn | None = None, checkpoint_dir: str | None = None,
             checkpoint_every: int = 1, keep: int = 2,
             continue_other_run: bool = False) -> TtrlResult:
  """Runs `config.steps` TTRL updates over `queries` (cyclically); see the module docstring.
  Evolution: evolve_fn when given (it applies its replies), else distill_fn's reply per due
  bucket, applied here.

  With checkpoint_dir, every `checkpoint_every` steps and after the last one the planner's
  state (experts, optimiser state, rng, step) is saved, and beside it the history, the judge
  failure counts and a snapshot of the memory bank (`checkpoint.sidecar`); a later call resumes
  from the newest good step, with the bank put back as it was after that step, and repeats an
  unbroken run's metrics step for step. Another run's checkpoints (other config, queries or
  key) are refused unless `continue_other_run` (`rl.run.Run`)."""
  if not queries:
    raise ValueError("run_ttrl: no queries")
  if distill_fn is None and evolve_fn is None:
    raise ValueError("run_ttrl: give distill_fn or evolve_fn (the Distiller step)")
  updater = dataclasses.replace(updater, step=dataclasses.replace(
      updater.step, expert_lr=config.learning_rate,
      temperature=scoring_temperature(config.temperature),
      micro_batches=config.micro_batches or updater.step.micro_batches))
  judging, history = _Judging(judges), []
  meta, identity = _records(updater, config, queries, rng)
  template = TrainState(step=jnp.int32(0), experts=experts, router=None,
                        opt_states=updater.init_opt_state(experts), rng=rng,
                        cursor=jnp.int32(0))

  def step_fn(state: TrainState):  # one batch: episodes, judges, update, consolidation
    step, experts, opt, rng = int(state.step), state.experts, state.opt_states, state.rng
    batch = [queries[(step * config.batch_size + j) % len(queries)]
             for j in range(config.batch_size)]
    contexts = [bank.planner_context(q.question, q.caption, category=q.category,
                                     modality=q.modality) for q in batch]
    rng, key = jax.random.split(rng)
    groups = episode_fn(batch, contexts, with_experts(generator, experts), key, config)
    if len(groups) != len(batch) or any(len(g) != config.group_size for g in groups):
      raise ValueError(f"run_ttrl step {step}: episode_fn returned group sizes "
                       f"{[len(g) for g in groups]} for {len(batch)} queries x "
                       f"{config.group_size}")
    stats = collections.Counter()
    rewards, judged_episodes = _judge_groups(bank, batch, contexts, groups, config, judging,
                                             stats)
    trajectories = [[ep.trajectory for ep in g] for g in groups]
    experts, opt, metrics = updater.update(experts, opt, "planner", trajectories, rewards)
    buckets = [ctx.bucket for ctx in contexts]
    if evolve_fn is not None:
      rng, key = jax.random.split(rng)
      evolve = functools.partial(evolve_fn, bank, buckets, with_experts(generator, experts), key)
    else:
      evolve = functools.partial(_distill_due, bank, buckets, distill_fn)
    consolidate(bank, judged_episodes, stats, evolve=evolve)  # stored, then evolve() called
    judged = max(stats.pop("judged", 0), 1)
    for name in ("arbiter", "align", "lambda"):
      metrics[f"{name}_mean"] = stats.pop(f"{name}_sum", 0.0) / judged
    metrics.update({k: float(v) for k, v in stats.items()})
    metrics["judge_failures"] = float(sum(judging.failures.values()))
    history.append({"step": step + 1, **metrics})
    return TrainState(step=jnp.int32(step + 1), experts=experts, router=None, opt_states=opt,
                      rng=rng, cursor=jnp.int32(step + 1)), metrics

  with Run(checkpoint_dir, metadata=meta, identity=identity, every=checkpoint_every, keep=keep,
           continue_other_run=continue_other_run, bank=bank,
           payload=lambda: {"history": history,
                            "judge_failures": dict(judging.failures)}) as run:
    state = run.restore(template)
    history.extend(run.payload.get("history", []))
    judging.failures.update(run.payload.get("judge_failures", {}))
    state = run.loop(step_fn, state, steps=config.steps, progress=False,
                     logdir=None if logdir is None else os.path.join(logdir, "ttrl"))
  return TtrlResult(state.experts, history, judging.failures)


def _records(updater: ModuleUpdater, config: TtrlConfig, queries: Sequence[Query],
             rng) -> tuple[dict, dict]:
  """(what every checkpoint step records, the run that owns the folder: this config, these
  queries, from this key)."""
  meta = record(model=updater.model.config, lora=updater.lora, step=updater.step,
                ttrl=phase_record(config))
  return meta, record(ttrl=meta, queries=fingerprint([q.identity() for q in queries]),
                      rng=rng)


def _judge_groups(bank: MemoryBank, batch, contexts, groups, config: TtrlConfig,
                  judging: _Judging, stats: collections.Counter):
  """(rewards per group, the Judged episodes to consolidate) of one batch; counts in `stats`."""
  rewards, judged_episodes = [], []
  for query, ctx, group in zip(batch, contexts, groups):
    skill = bank.get_skill(ctx.bucket)
    conf = bank.skill_confidence(ctx.bucket)
    group_rewards, outcomes = _group_rewards(group, query, skill, conf, config, judging,
                                             stats, bank.config.skill_evidence_n, ctx.skill)
    rewards.append(group_rewards)
    complete = [i for i, c in enumerate(outcomes) if c is not None]
    stored = _stored(config.store, complete, group_rewards, [ep.answer for ep in group])
    for i, (ep, correct) in enumerate(zip(group, outcomes)):
      if correct is None:
        continue
      memory = NewMemory(query.question, ep.summary or ep.workflow, correct, *ctx.bucket,
                         caption=query.caption, data_id=query.data_id)
      shown = tuple(dict.fromkeys(ctx.memory_ids + tuple(ep.replan_memory_ids)))
      judged_episodes.append(Judged(memory, correct, shown, store=i in stored))
      stats["correct"] += correct
  return rewards, judged_episodes
