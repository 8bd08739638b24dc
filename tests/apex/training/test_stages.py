"""The alternating stages with fake rollouts: order, freezing, per-stage metrics, validation."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from apex_jax.training import stages as st
from morse_jax.rl.metrics import read_jsonl
from tests.apex.training.conftest import LORA, STEP


class FakeGenerator:
  """Records which module rolled out with which weights (the loop hands each rollout a copy
  holding them, `with_experts`; the records are shared)."""

  def __init__(self):
    self.experts, self.seen = None, []


def make_stages(tiny, steps=(2, 1, 1), lr=STEP.expert_lr, fail_at=None):
  groups = {m: tiny.groups(m) for m in st.STAGE_ORDER}

  def rollout_fn(batch, generator, rng, config):
    generator.seen.append((config.module, generator.experts, list(batch)))
    if fail_at is not None and len(generator.seen) == fail_at:
      raise RuntimeError("rollout died")
    return groups[config.module], [[1.0, 0.0], [0.0, 1.0]]

  return [st.Stage(st.StageConfig(m, steps=n, batch_size=2, group_size=2, learning_rate=lr),
                   data=[f"{m} item {i}" for i in range(3)], rollout_fn=rollout_fn)
          for m, n in zip(st.STAGE_ORDER, steps)]


def changed(a, b):
  """Role experts whose weights differ between a and b."""
  return {role for k, role in enumerate(LORA.roles)
          if any(not np.array_equal(np.asarray(x)[:, k], np.asarray(y)[:, k])
                 for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))}


def test_stage_order_freezing_and_metrics(tiny, tmp_path):
  gen = FakeGenerator()
  result = st.run_stages(tiny.updater(), tiny.experts, make_stages(tiny), gen,
                         rng=jax.random.key(0), logdir=str(tmp_path))
  assert [(h["module"], h["step"]) for h in result.history] == [
      ("executor", 1), ("executor", 2), ("distiller", 1), ("planner", 1)]
  assert all(h["skipped"] == 0.0 and np.isfinite(h["expert_loss"]) for h in result.history)
  # the data is read cyclically, batch_size items per step
  assert gen.seen[1][2] == ["executor item 2", "executor item 0"]
  # each stage changed its own expert only; the rollouts saw the current weights
  at_distiller, at_planner = gen.seen[2][1], gen.seen[3][1]
  assert gen.seen[0][1] is tiny.experts
  assert changed(tiny.experts, at_distiller) == {"executor"}
  assert changed(at_distiller, at_planner) == {"distiller"}
  assert changed(at_planner, result.experts) == {"planner"}
  assert gen.experts is None  # the rollouts got copies holding the weights (with_experts)
  assert [h["skipped_total"] for h in result.history] == [0.0] * 4
  # one reward curve per stage
  dirs = sorted(os.listdir(tmp_path))
  assert dirs == ["stage0_executor", "stage1_distiller", "stage2_planner"]
  records = read_jsonl(os.path.join(tmp_path, "stage0_executor", "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2]
  assert records[0]["reward_mean"] == 0.5 and records[0]["learning_rate"] == STEP.expert_lr


def test_rollout_shape_is_checked(tiny):
  stage = make_stages(tiny)[0]
  bad = st.Stage(stage.config, stage.data, lambda b, g, r, c: ([[]] * 2, [[], []]))
  with pytest.raises(ValueError, match="group 0 has 0 trajectories, group_size is 2"):
    st.run_stages(tiny.updater(), tiny.experts, [bad], FakeGenerator(), rng=jax.random.key(0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(module="critic"), "StageConfig.module 'critic'"),
    (dict(steps=0), "StageConfig.steps must be an int >= 1, got 0"),
    (dict(group_size=1), "StageConfig.group_size must be >= 2"),
    (dict(learning_rate=0.0), "StageConfig.learning_rate must be > 0, got 0.0"),
    (dict(batch_size=2.0), "StageConfig.batch_size must be an int >= 1, got 2.0"),
    (dict(micro_batches=-1), "StageConfig.micro_batches must be an int >= 0"),
])
def test_stage_config_validation(kwargs, message):
  base = dict(module="executor", steps=1, batch_size=1, group_size=2, learning_rate=1e-5)
  with pytest.raises(ValueError, match=message):
    st.StageConfig(**{**base, **kwargs})


@pytest.mark.slow
def test_resume_from_checkpoint(tiny, tmp_path):
  """Killed as the planner stage starts, resumed: the run ends where an unbroken one would."""
  ckpt = str(tmp_path / "ckpt")
  with pytest.raises(RuntimeError, match="rollout died"):
    st.run_stages(tiny.updater(), tiny.experts, make_stages(tiny, fail_at=4), FakeGenerator(),
                  rng=jax.random.key(0), checkpoint_dir=ckpt, checkpoint_every=1,
                  logdir=str(tmp_path / "logs"))
  gen = FakeGenerator()
  resumed = st.run_stages(tiny.updater(), tiny.experts, make_stages(tiny), gen,
                          rng=jax.random.key(0), checkpoint_dir=ckpt, checkpoint_every=1,
                          logdir=str(tmp_path / "logs"))
  assert [s[0] for s in gen.seen] == ["planner"]  # only the planner's step was run again
  unbroken = st.run_stages(tiny.updater(), tiny.experts, make_stages(tiny), FakeGenerator(),
                           rng=jax.random.key(0))
  assert not changed(resumed.experts, unbroken.experts)
  # the whole run's history, from the checkpoint's sidecar: step for step the unbroken one's
  assert resumed.history == unbroken.history
  records = read_jsonl(str(tmp_path / "logs" / "stage2_planner" / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1]


def test_rollout_metrics_reach_the_stage_metrics(tiny, tmp_path):
  """A rollout's `metrics` (its judge counts) are written with the step's metrics."""
  groups = tiny.groups("executor")

  class Rollout:
    metrics = {}

    def __call__(self, batch, generator, rng, config):
      self.metrics = {"judge_calls": 4.0, "judge_fallbacks": 1.0}
      return groups, [[1.0, 1.0], [0.0, 0.0]]  # flat groups: the update is skipped, no compile

  stage = st.Stage(st.StageConfig("executor", steps=1, batch_size=2, group_size=2,
                                  learning_rate=1e-3), data=["q"], rollout_fn=Rollout())
  result = st.run_stages(tiny.updater(), tiny.experts, [stage], FakeGenerator(),
                         rng=jax.random.key(0), logdir=str(tmp_path))
  assert result.history[0]["judge_calls"] == 4.0 and result.history[0]["judge_fallbacks"] == 1.0
  records = read_jsonl(os.path.join(tmp_path, "stage0_executor", "metrics.jsonl"))
  assert records[0]["judge_fallbacks"] == 1.0


def test_stage_checkpoints_ignore_how_an_update_is_computed(tiny):
  """A stage run stopped by the OOM killer resumes with its rows split or layers recomputed:
  the stage checkpoints' metadata is the same with either."""
  stages = make_stages(tiny)
  metadata = lambda updater: st._records(updater, stages, jax.random.key(0))[0]
  split = tiny.updater(step=dataclasses.replace(STEP, micro_batches=2, remat=True))
  assert metadata(split) == metadata(tiny.updater())
  assert "micro_batches" not in metadata(split)["step"]
  other = tiny.updater(step=dataclasses.replace(STEP, expert_lr=1e-3))
  assert metadata(other) != metadata(tiny.updater())


def test_a_stage_sets_its_updates_micro_batches(tiny, monkeypatch):
  """StageConfig.micro_batches replaces the updater's for that stage's updates (0: kept), and
  the checkpoints' records leave it out, as they leave out the step's."""
  seen, original = [], st._step_fn

  def spy(stage, index, updater, *args):
    seen.append((stage.config.module, updater.step.micro_batches))
    return original(stage, index, updater, *args)

  monkeypatch.setattr(st, "_step_fn", spy)
  groups = {m: tiny.groups(m) for m in st.STAGE_ORDER}
  flat = lambda batch, generator, rng, config: (groups[config.module], [[1.0, 1.0]] * 2)
  stages = [st.Stage(st.StageConfig(m, steps=1, batch_size=2, group_size=2, learning_rate=1e-3,
                                    micro_batches=n), data=["q"], rollout_fn=flat)
            for m, n in zip(st.STAGE_ORDER, (2, 0, 4))]
  st.run_stages(tiny.updater(), tiny.experts, stages, FakeGenerator(), rng=jax.random.key(0))
  assert seen == [("executor", 2), ("distiller", STEP.micro_batches), ("planner", 4)]
  plain = [st.Stage(dataclasses.replace(s.config, micro_batches=0), s.data, s.rollout_fn)
           for s in stages]
  records = lambda stages: st._records(tiny.updater(), stages, jax.random.key(0))[0]
  assert records(stages) == records(plain)
  assert "micro_batches" not in records(stages)["stages"][0]
