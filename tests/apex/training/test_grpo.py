"""One-module GRPO on the tiny backbone: packing, finiteness, only the trained expert moves,
skipped updates are counted, and a real learning check."""

import jax
import numpy as np
import pytest

from apex_jax.training import grpo
from morse_jax.llm.sampling import bucket
from morse_jax.lora import LoraConfig
from tests.apex.training.conftest import LORA, PROMPT


def expert_slices(experts, k):
  return [np.asarray(x)[:, k] for x in jax.tree.leaves(experts)]


def same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_packed_batch_layout(tiny):
  groups = tiny.groups("executor")
  batch, num_routes = grpo.packed_batch(groups, [[1.0, 0.0], [0.5, 0.5]], expert=1)
  assert num_routes == 2 and batch.tokens.shape == (4, bucket(8))
  np.testing.assert_array_equal(batch.route, [0, 0, 1, 1])
  np.testing.assert_array_equal(batch.routes.idx[:, 0], [1, 1, 1, 1])
  # only the generated tokens are trained on, with their sampling log-probs
  assert np.asarray(batch.loss_mask)[:, :PROMPT].sum() == 0
  assert np.asarray(batch.loss_mask)[:, PROMPT:].sum() == 12
  np.testing.assert_allclose(np.asarray(batch.logp_old)[0, PROMPT:PROMPT + 3],
                             groups[0][0].segments[1].logprobs)
  # 3 groups of 2 -> rows and groups padded to powers of two, padding rows invalid
  batch, num_routes = grpo.packed_batch(groups + groups[:1], [[1, 0]] * 3, expert=0)
  assert num_routes == 4 and batch.tokens.shape[0] == 8
  np.testing.assert_array_equal(batch.valid, [1] * 6 + [0] * 2)


def test_packed_batch_rejects_mismatch(tiny):
  with pytest.raises(ValueError, match="group 1 has 2 trajectories and 1 rewards"):
    grpo.packed_batch(tiny.groups("planner"), [[1.0, 0.0], [1.0]], expert=0)
  with pytest.raises(ValueError, match="non-finite reward"):
    grpo.packed_batch(tiny.groups("planner"), [[1.0, float("nan")], [1.0, 0.0]], expert=0)


def test_update_moves_only_the_trained_expert(tiny):
  upd = tiny.updater()
  assert upd.step.weight_decay > 0  # it would shrink every expert; the others must not move
  opt = upd.init_opt_state(tiny.experts)
  new, opt, metrics = upd.update(tiny.experts, opt, "distiller", tiny.groups("distiller"),
                                 [[1.0, 0.0], [0.0, 1.0]])
  assert np.isfinite(metrics["expert_loss"]) and metrics["skipped"] == 0.0
  assert metrics["expert_grad_norm"] > 0
  k = LORA.role_index("distiller")
  assert not same(expert_slices(new, k), expert_slices(tiny.experts, k))
  for other in ("planner", "executor"):
    j = LORA.role_index(other)
    assert same(expert_slices(new, j), expert_slices(tiny.experts, j)), other


def test_equal_rewards_skip_and_count(tiny):
  upd = tiny.updater()
  opt = upd.init_opt_state(tiny.experts)
  new, opt2, metrics = upd.update(tiny.experts, opt, "planner", tiny.groups("planner"),
                                  [[0.7, 0.7], [0.2, 0.2]])
  assert metrics["skipped"] == 1.0
  assert new is tiny.experts and opt2 is opt
  # the counters live in the metrics: the updater holds no state across calls
  _, _, metrics = upd.update(tiny.experts, opt, "planner", tiny.groups("planner"),
                             [[1.0, 1.0], [0.0, 0.0]])
  assert metrics["skipped"] == 1.0 and "skipped_total" not in metrics


def test_frozen_updater_changes_nothing_and_reports_the_rewards(tiny):
  import dataclasses

  upd = tiny.updater()
  frozen = grpo.FrozenUpdater(**{f.name: getattr(upd, f.name) for f in dataclasses.fields(upd)})
  opt = frozen.init_opt_state(tiny.experts)
  new, new_opt, metrics = frozen.update(tiny.experts, opt, "planner", tiny.groups("planner"),
                                        [[1.0, 0.0], [0.5, 0.5]])
  assert new is tiny.experts and new_opt is opt
  assert metrics["frozen"] == metrics["skipped"] == 1.0
  assert metrics["reward_mean"] == pytest.approx(0.5)  # (1 + 0 + 0.5 + 0.5) / 4
  with pytest.raises(ValueError, match="module 'writer' not in"):
    frozen.update(tiny.experts, opt, "writer", tiny.groups("planner"), [[1.0, 0.0]] * 2)


def test_wrong_module_or_roles_rejected(tiny):
  upd = tiny.updater()
  with pytest.raises(ValueError, match="holds 'executor' trajectories, training 'planner'"):
    upd.update(tiny.experts, upd.init_opt_state(tiny.experts), "planner",
               tiny.groups("executor"), [[1.0, 0.0], [1.0, 0.0]])
  with pytest.raises(ValueError, match="lacks"):
    grpo.ModuleUpdater(tiny.updater().model,
                       LoraConfig(roles=("planner", "executor"), num_subtask_experts=0))


def test_positive_advantage_sequence_gains_probability(tiny):
  """Row 0 wins its group, row 1 loses: after a few updates on the same batch, row 0's
  generated tokens are likelier and row 1's less likely under the executor expert."""
  upd = tiny.updater()
  groups = tiny.groups("executor")
  tokens = np.stack([np.concatenate([np.asarray(s.tokens) for s in t.segments])
                     for g in groups for t in g])
  def seq_logp(experts):
    return tiny.logprobs(experts, "executor", tokens)[:, PROMPT:].sum(-1)
  before = seq_logp(tiny.experts)
  experts, opt = tiny.experts, upd.init_opt_state(tiny.experts)
  for _ in range(4):
    experts, opt, metrics = upd.update(experts, opt, "executor", groups, [[1.0, 0.0], [0.5, 0.5]])
    assert np.isfinite(metrics["expert_loss"])
  after = seq_logp(experts)
  assert after[0] > before[0] + 0.05 and after[1] < before[1] - 0.05
  # the flat group (rows 2, 3) carries no advantage; only shared weights move it slightly
  assert abs(after[2] - before[2]) < abs(after[0] - before[0])
