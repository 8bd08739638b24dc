"""The training loop: a run stopped after step k and resumed equals an unbroken run."""

import copy
import dataclasses
import os

import chex
import jax
import numpy as np
import pytest

from morse_jax import checkpoint, llm
from morse_jax.rl import metrics as metrics_lib
from morse_jax.rl import trainer as trainer_lib
from morse_jax.rl import train_step as ts
from morse_jax.tasks.token_bandit import TokenBandit
from tests.rl import test_train_step as shapes  # same model and step settings: compiles are shared

ROLLOUT = trainer_lib.RolloutConfig(routes_per_node=2, group_size=2, max_new_tokens=6,
                                    kernel="gather")
TASK = TokenBandit(vocab_size=shapes.CONFIG.vocab_size, categories=4,
                   embed_dim=shapes.EMB_DIM, prompt_len=5)


@pytest.fixture(scope="module")
def trainer():
  backbone = llm.init_random(shapes.CONFIG, jax.random.key(0), scale=0.3, norm_jitter=0.2)
  return trainer_lib.Trainer(llm.Model(shapes.CONFIG, backbone), shapes.LORA, shapes.RCFG,
                             shapes.STEP, ROLLOUT, embed_dim=shapes.EMB_DIM)


def run(trainer, directory, steps, resume=False):
  ckpt = checkpoint.Checkpoints(str(directory / "ckpt"), every=2, keep=3,
                               metadata=trainer.metadata())
  state = trainer.init_state(jax.random.key(7))
  resume_step = None
  if resume:
    state = ckpt.restore(state)
    resume_step = int(state.step)
  with metrics_lib.MetricsWriter(str(directory), total_steps=steps, progress=False,
                                 resume_step=resume_step) as writer:
    state = trainer_lib.fit(trainer, state, TASK, steps=steps, nodes_per_step=2,
                            checkpoints=ckpt, writer=writer)
  ckpt.close()
  return state, metrics_lib.read_jsonl(os.path.join(directory, "metrics.jsonl"))


def strip(rows):
  return [{k: v for k, v in r.items() if k not in trainer_lib.TIMING_KEYS} for r in rows]


@pytest.mark.slow
def test_killed_and_resumed_run_equals_unbroken_run(trainer, tmp_path):
  ref_state, ref = run(trainer, tmp_path / "unbroken", 4)
  run(trainer, tmp_path / "killed", 3)  # saved at step 2 and at the end (3); "killed" after 3
  # Drop the final checkpoint, as if the process died after step 3 before saving it.
  import shutil
  shutil.rmtree(tmp_path / "killed" / "ckpt" / "3")
  got_state, got = run(trainer, tmp_path / "killed", 4, resume=True)
  assert [r["step"] for r in got] == [1, 2, 3, 4]  # step 3 of the killed run was dropped, redone
  assert strip(got) == strip(ref)
  chex.assert_trees_all_equal(dataclasses.replace(got_state, rng=None),
                              dataclasses.replace(ref_state, rng=None))
  row = ref[-1]
  for key in ("reward_mean", "reward_std", "frac_reward_zero_std", "skipped", "clip_frac",
              "entropy", "expert_grad_norm", "router_grad_norm", "route_entropy",
              "expert_usage/0", "tokens_per_s"):
    assert key in row, key
  assert row["expert_usage/0"] == 8  # every row carries the execute role expert
  assert sum(row[f"expert_usage/{k}"] for k in range(2, 6)) == 8 * 2  # two subtask experts a row


@pytest.fixture(scope="module")
def two_steps(trainer, tmp_path_factory):
  """A run of 2 steps, its checkpoint at step 2: what the restore tests read (never write)."""
  directory = tmp_path_factory.mktemp("two_steps")
  run(trainer, directory, 2)
  return directory


def test_checkpoint_of_another_run_is_refused(trainer, two_steps):
  tmp_path = two_steps
  other = trainer_lib.Trainer(trainer.model, shapes.LORA, shapes.RCFG,
                              dataclasses.replace(shapes.STEP, expert_lr=1e-3), ROLLOUT,
                              embed_dim=shapes.EMB_DIM)
  ckpt = checkpoint.Checkpoints(str(tmp_path / "ckpt"), every=2, keep=3,
                               metadata=other.metadata())
  with pytest.raises(checkpoint.CheckpointError, match="step.expert_lr=0.03, this run has 0.001"):
    ckpt.restore(other.init_state(jax.random.key(7)))
  assert ckpt.latest_step() == 2  # nothing was removed


def test_bad_node_is_named(trainer):
  state = trainer.init_state(jax.random.key(0))
  with pytest.raises(ValueError, match="node 1 has neither an embedding nor fixed experts"):
    trainer.requests(state.rng, state.router, [trainer_lib.TrainNode([1, 2], embedding=np.ones(6)),
                                               trainer_lib.TrainNode([1, 2])])


def test_ppo_epochs_move_experts_further_and_the_router_once(trainer):
  """epochs=2: the same rollout (same rng) and the same router as one epoch; the experts take a
  second step."""
  two = copy.copy(trainer)
  two.update = dataclasses.replace(trainer.update, step=dataclasses.replace(trainer.step_config,
                                                                           epochs=2))
  nodes, _ = TASK.batch(0, 2)
  reward_fn = lambda rollout: np.arange(rollout.num_rows) % 2  # signal in every route
  s1, m1, out1 = trainer.step(trainer.init_state(jax.random.key(7)), nodes, reward_fn)
  s2, m2, out2 = two.step(two.init_state(jax.random.key(7)), nodes, reward_fn)
  np.testing.assert_array_equal(out1.packed.tokens, out2.packed.tokens)
  chex.assert_trees_all_equal(s1.router, s2.router)
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
           for a, b in zip(jax.tree.leaves(s1.experts), jax.tree.leaves(s2.experts))]
  assert m1["skipped"] == 0 and max(moved) > 1e-4
  assert m1["expert_loss"] == pytest.approx(m2["expert_loss"], rel=1e-5)  # first epoch's metrics


def test_execution_only_settings_resume_the_same_run(trainer, two_steps):
  """A run stopped by the OOM killer may resume with layers recomputed or rows split: they
  leave the update's result unchanged, so they are not part of the checkpoint's metadata."""
  tmp_path = two_steps
  other = trainer_lib.Trainer(trainer.model, shapes.LORA, shapes.RCFG,
                              dataclasses.replace(shapes.STEP, remat=True, micro_batches=2),
                              ROLLOUT, embed_dim=shapes.EMB_DIM)
  assert other.metadata() == trainer.metadata()
  assert not set(ts.EXECUTION_ONLY) & set(trainer.metadata()["step"])
  ckpt = checkpoint.Checkpoints(str(tmp_path / "ckpt"), every=2, keep=3,
                               metadata=other.metadata())
  assert int(ckpt.restore(other.init_state(jax.random.key(7))).step) == 2
