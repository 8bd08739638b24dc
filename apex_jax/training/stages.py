"""Three-stage alternating GRPO (APEx): Executor, then Distiller, then Planner.

Each stage trains one module's role expert while the other two are frozen (they still act in
the rollouts: the planner's plan guides the executor, the executor's answers feed the planner's
reward). A stage has its own data, reward (inside its rollout function), group size, step count
and learning rate, and its own optimiser state, so moments never carry across modules.

A stage's rollout function is the only contact with the agents:

  rollout_fn(batch, generator, rng, config) -> (groups, rewards)

batch: `config.batch_size` items of the stage's data; groups: one list of `config.group_size`
Trajectory of `config.module` per item; rewards: the matching floats (`rewards.py`). The
generator is the agents' sampler; each rollout gets `with_experts(generator, current weights)`
(a copy: the caller's generator is left as it is; the trained weights are the result's).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from morse_jax.rl.logprobs import scoring_temperature
from morse_jax.rl.run import Run, record
from morse_jax.rl.state import TrainState
from morse_jax.rl.train_step import EXECUTION_ONLY

from apex_jax.agents.generator import with_experts
from apex_jax.agents.trajectory import MODULES, Trajectory
from apex_jax.training.grpo import ModuleUpdater

STAGE_ORDER = ("executor", "distiller", "planner")  # the paper's alternation

RolloutFn = Callable[[Sequence[Any], Any, jax.Array, "StageConfig"],
                     tuple[Sequence[Sequence[Trajectory]], Sequence[Sequence[float]]]]


@dataclasses.dataclass(frozen=True)
class StageConfig:
  module: str  # the trained module; the other two are frozen
  steps: int  # GRPO updates
  batch_size: int  # inputs (questions, buckets) per update
  group_size: int  # trajectories per input (G)
  learning_rate: float
  temperature: float = 1.0  # the rollout's sampling temperature (the update scores at it)
  max_new_tokens: int = 256  # per generated turn, for the rollout function
  # the update's micro-batches in this stage (0: the updater's StepConfig.micro_batches): the
  # stages' rows and lengths differ (configs/apex/paper.py: 32 to 1024 rows of up to 32768
  # tokens), and each is set so that one micro-batch fits a device (launchers.fit)
  micro_batches: int = 0

  def __post_init__(self):
    if self.module not in MODULES:
      raise ValueError(f"StageConfig.module {self.module!r} not in {MODULES}")
    for name in ("steps", "batch_size", "group_size", "max_new_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"StageConfig.{name} must be an int >= 1, got {value!r}")
    if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) \
        or self.micro_batches < 0:
      raise ValueError(f"StageConfig.micro_batches must be an int >= 0 (0: the StepConfig's), "
                       f"got {self.micro_batches!r}")
    if self.group_size < 2:
      raise ValueError(f"StageConfig.group_size must be >= 2 (GRPO compares a group's "
                       f"samples), got {self.group_size!r}")
    if not self.learning_rate > 0:
      raise ValueError(f"StageConfig.learning_rate must be > 0, got {self.learning_rate!r}")
    if not self.temperature >= 0:
      raise ValueError(f"StageConfig.temperature must be >= 0, got {self.temperature!r}")


@dataclasses.dataclass(frozen=True)
class Stage:
  config: StageConfig
  data: Sequence[Any]  # read cyclically, batch_size items per step
  rollout_fn: RolloutFn

  def __post_init__(self):
    if not len(self.data):
      raise ValueError(f"Stage {self.config.module!r}: no data")

  def batch(self, step: int) -> list:
    n, size = len(self.data), self.config.batch_size
    return [self.data[(step * size + j) % n] for j in range(size)]


@dataclasses.dataclass
class StagesResult:
  experts: Any
  history: list[dict]  # one record per update: stage, module, step, metrics
  rng: jax.Array


def _check_rollout(groups, rewards, config: StageConfig, step: int) -> None:
  where = f"stage {config.module!r} step {step}"
  if len(groups) != config.batch_size or len(rewards) != config.batch_size:
    raise ValueError(f"{where}: rollout_fn returned {len(groups)} groups and {len(rewards)} "
                     f"reward lists for a batch of {config.batch_size}")
  for g, group in enumerate(groups):
    if len(group) != config.group_size:
      raise ValueError(f"{where}: group {g} has {len(group)} trajectories, group_size is "
                       f"{config.group_size}")


def phase_record(config) -> dict:
  """A StageConfig's or TtrlConfig's fields as checkpoints record them: without those that
  change how an update is computed, not its result (`train_step.EXECUTION_ONLY`: a stage
  stopped by the OOM killer resumes with more micro-batches; earlier runs' records, which
  have no micro_batches, still match)."""
  return {k: v for k, v in dataclasses.asdict(config).items() if k not in EXECUTION_ONLY}


def _records(updater: ModuleUpdater, stages: Sequence[Stage], rng) -> tuple[dict, dict]:
  """(what every checkpoint step records, the run that owns the folder: these stages from this
  key)."""
  meta = record(model=updater.model.config, lora=updater.lora, step=updater.step,
                stages=[phase_record(s.config) for s in stages])
  return meta, record(stages=meta, rng=rng)


def run_stages(updater: ModuleUpdater, experts, stages: Sequence[Stage], generator, *,
               rng: jax.Array, logdir: str | None = None, checkpoint_dir: str | None = None,
               checkpoint_every: int = 0, keep: int = 2,
               continue_other_run: bool = False) -> StagesResult:
  """Runs the stages in order; metrics per stage go to `<logdir>/stage<i>_<module>/`
  (metrics.jsonl + TensorBoard: the stage's reward curve). With checkpoint_dir, a TrainState
  (global step, experts, the current stage's optimiser state, rng) is saved every
  `checkpoint_every` updates and at the end of each stage, and a later call resumes from the
  latest good one (the stage and its step follow from the global step): finished stages are
  skipped, `history` is the whole run's (kept in each step's sidecar, `checkpoint.sidecar`), and
  a resumed run's metrics repeat an unbroken run's step for step. Another run's checkpoints
  (other stages or key) are refused unless `continue_other_run` (`rl.run.Run`)."""
  if not stages:
    raise ValueError("run_stages: no stages")
  history = []
  meta, identity = _records(updater, stages, rng)
  template = TrainState(step=jnp.int32(0), experts=experts, router=None,
                        opt_states=updater.init_opt_state(experts), rng=rng,
                        cursor=jnp.int32(0))
  # A step written before sidecars existed restores with an empty history.
  with Run(checkpoint_dir, metadata=meta, identity=identity,
           every=checkpoint_every or 10**9, keep=keep, continue_other_run=continue_other_run,
           payload=lambda: {"history": history}, sidecar_required=False) as run:
    state = run.restore(template)
    history.extend(run.payload.get("history", []))
    start = 0
    for index, stage in enumerate(stages):
      end, done = start + stage.config.steps, int(state.step)
      if done < end:
        stage_updater = dataclasses.replace(updater, step=dataclasses.replace(
            updater.step, expert_lr=stage.config.learning_rate,
            temperature=scoring_temperature(stage.config.temperature),
            micro_batches=stage.config.micro_batches or updater.step.micro_batches))
        # the moments are the stage's own: fresh at its start, restored inside it
        opt = (state.opt_states if done > start else
               stage_updater.init_opt_state(state.experts))
        state = dataclasses.replace(state, opt_states=opt, cursor=jnp.int32(done - start))
        name = f"stage{index}_{stage.config.module}"
        state = run.loop(_step_fn(stage, index, stage_updater, generator, history), state,
                         steps=end, logdir=None if logdir is None else os.path.join(logdir, name),
                         progress=False, log_offset=start)
      start = end
  return StagesResult(state.experts, history, state.rng)


def _step_fn(stage: Stage, index: int, updater: ModuleUpdater, generator, history: list):
  """One update of `stage` (the `index`-th): state.step counts the whole run's updates,
  state.cursor this stage's; its record is appended to `history`."""
  cfg = stage.config
  # this stage's skipped updates (logged as skipped_total; carried on from a resumed history)
  skipped = sum(h["stage"] == index and h["skipped"] != 0 for h in history)

  def step_fn(state):
    nonlocal skipped
    step, experts, opt, rng = int(state.cursor), state.experts, state.opt_states, state.rng
    rng, key = jax.random.split(rng)
    groups, rewards = stage.rollout_fn(stage.batch(step), with_experts(generator, experts), key,
                                       cfg)
    _check_rollout(groups, rewards, cfg, step)
    experts, opt, metrics = updater.update(experts, opt, cfg.module, groups, rewards)
    metrics.update(getattr(stage.rollout_fn, "metrics", None) or {})  # judge counts
    skipped += int(metrics["skipped"] != 0)
    metrics.update(skipped_total=float(skipped), stage=float(index),
                   learning_rate=cfg.learning_rate)
    history.append({"stage": index, "module": cfg.module, "step": step + 1, **metrics})
    return TrainState(step=jnp.int32(int(state.step) + 1), experts=experts, router=None,
                      opt_states=opt, rng=rng, cursor=jnp.int32(step + 1)), metrics

  return step_fn
