"""Advantages and losses against numbers worked out by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import rl
from morse_jax.rl import advantages

REWARDS = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]  # B = 3 routes, M = 2 candidates


def test_hgrpo_by_hand():
  adv = rl.hgrpo(REWARDS)
  # mu = [0.5, 1, 0], sigma = [0.5, 0, 0]: only route 0 has within-route signal.
  np.testing.assert_allclose(adv.within, [[1, -1], [0, 0], [0, 0]], atol=1e-5)
  # sigma_C = std([0.5, 1, 0]) = sqrt(1/6); A_cross = (mu - 0.5) / sigma_C.
  s = math.sqrt(1 / 6)
  np.testing.assert_allclose(adv.cross, [0.0, 0.5 / s, -0.5 / s], atol=1e-5)


def test_grpo_by_hand():
  # mean 0.5, std 0.5 over all six rewards.
  np.testing.assert_allclose(rl.grpo(REWARDS), [[1, -1], [1, 1], [-1, -1]], atol=1e-5)


def _flat(rewards):
  """advantages.flat_nodes of one node laid out as B routes x M rows (replaces should_skip)."""
  u = np.asarray(rewards, np.float32)
  b, m = u.shape
  return bool(advantages.flat_nodes(u.ravel(), np.repeat(np.arange(b), m), np.ones(b * m),
                                    num_nodes=1, routes_per_node=b)[0])


def test_zero_variance_groups_give_zero_and_skip():
  same = [[0.7, 0.7], [0.7, 0.7]]
  adv = rl.hgrpo(same)
  assert not np.any(np.asarray(adv.within)) and not np.any(np.asarray(adv.cross))
  assert not np.any(np.asarray(rl.grpo(same)))
  assert _flat(same)
  assert _flat([[0.5, 0.5002]])  # std 1e-4 < 5e-4
  adv = rl.hgrpo(REWARDS)
  assert not _flat(REWARDS)
  # Routes differ but each route is constant: the experts get nothing, the router does.
  adv = rl.hgrpo([[1.0, 1.0], [0.0, 0.0]])
  assert not np.any(np.asarray(adv.within))
  np.testing.assert_allclose(adv.cross, [1, -1], atol=1e-5)
  assert not _flat([[1.0, 1.0], [0.0, 0.0]])


def test_clipping_at_five():
  rewards = [[0.0] * 99 + [1.0]]  # mean 0.01, std 0.0995: the outlier's advantage is 9.95
  assert float(rl.grpo(rewards, clip=None).max()) == pytest.approx(9.95, rel=1e-3)
  assert float(rl.grpo(rewards).max()) == 5.0
  assert float(rl.hgrpo(rewards).within.max()) == 5.0


def test_policy_loss_by_hand():
  logp = jnp.log(jnp.asarray([[0.5, 0.25]]))
  old = jnp.log(jnp.asarray([[0.25, 0.25]]))
  mask = jnp.ones((1, 2))
  # ratio [2, 1]; A = 1: min(2, 1.2) and 1 -> loss -(1.2 + 1) / 2; token 0 is clipped.
  loss, m = rl.policy_loss(logp, old, jnp.asarray([1.0]), mask)
  assert float(loss) == pytest.approx(-1.1, abs=1e-6) and float(m["clip_frac"]) == 0.5
  # A = -1: min(-2, -1.2) = -2 (the pessimistic, unclipped term) -> loss 1.5, nothing clipped.
  loss, m = rl.policy_loss(logp, old, jnp.asarray([-1.0]), mask)
  assert float(loss) == pytest.approx(1.5, abs=1e-6) and float(m["clip_frac"]) == 0.0
  # epsilon_high 0.5 lets the ratio rise to 1.5.
  loss, _ = rl.policy_loss(logp, old, jnp.asarray([1.0]), mask, epsilon_high=0.5)
  assert float(loss) == pytest.approx(-1.25, abs=1e-6)
  # Masked tokens (prompt, tool output) do not count.
  loss, _ = rl.policy_loss(logp, old, jnp.asarray([1.0]), jnp.asarray([[0.0, 1.0]]))
  assert float(loss) == pytest.approx(-1.0, abs=1e-6)


def test_k3_kl_by_hand_and_in_the_loss():
  logp, ref = jnp.log(0.5), jnp.log(0.25)
  assert float(rl.k3_kl(logp, ref)) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
  assert float(rl.k3_kl(logp, logp)) == 0.0
  lp = jnp.full((1, 2), jnp.log(0.5))
  loss, m = rl.policy_loss(lp, lp, jnp.asarray([0.0]), jnp.ones((1, 2)), kl_coef=0.1,
                           logp_ref=jnp.full((1, 2), jnp.log(0.25)))
  assert float(loss) == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-6)
  assert float(m["kl"]) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
  with pytest.raises(ValueError, match="needs logp_ref"):
    rl.policy_loss(lp, lp, jnp.asarray([0.0]), jnp.ones((1, 2)), kl_coef=0.1)


def test_aggregations_by_hand():
  values = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
  mask = jnp.asarray([[1, 1, 1], [1, 0, 0]])
  assert float(rl.aggregate(values, mask, "token-mean")) == pytest.approx(2.5)
  assert float(rl.aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx(3.0)
  assert float(rl.aggregate(values, mask, "seq-mean-token-sum-norm")) == pytest.approx(5 / 3)
  with pytest.raises(ValueError, match="mode 'sum'"):
    rl.aggregate(values, mask, "sum")


def test_router_loss_by_hand():
  loss = rl.router_loss(jnp.asarray([-1.0, -2.0]), jnp.asarray([1.0, -1.0]), alpha_pi=0.15)
  assert float(loss) == pytest.approx(-0.15 * (-1.0 + 2.0))


def test_row_advantages_equal_the_per_node_functions():
  """Two nodes of B 3 x M 2, rows shuffled, plus padding rows and a flat (skipped) third node."""
  node0 = np.asarray(REWARDS)
  node1 = np.asarray([[0.2, 0.9], [0.4, 0.4], [1.0, 0.1]])
  node2 = np.full((3, 2), 0.5)
  rewards = np.concatenate([node0.ravel(), node1.ravel(), node2.ravel(), [7.0, -3.0]])
  route = np.concatenate([np.arange(18) // 2, [0, 4]])
  valid = np.concatenate([np.ones(18), np.zeros(2)])
  order = np.random.default_rng(0).permutation(20)
  kw = dict(num_nodes=4, routes_per_node=3)  # node 3 has no rows (padding node)
  h = rl.row_advantages(rewards[order], route[order], valid[order], **kw)
  inverse = np.argsort(order)
  policy = np.asarray(h.policy)[inverse]
  for n, u in enumerate([node0, node1]):
    want = rl.hgrpo(u)
    np.testing.assert_allclose(policy[6 * n:6 * n + 6], np.asarray(want.within).ravel(), atol=1e-6)
    np.testing.assert_allclose(h.route[3 * n:3 * n + 3], want.cross, atol=1e-6)
  assert not np.any(policy[12:]) and not np.any(np.asarray(h.route)[6:])  # flat node, padding
  np.testing.assert_array_equal(h.node_skipped, [False, False, True, False])
  g = rl.row_advantages(rewards[order], route[order], valid[order], estimator="grpo", **kw)
  policy = np.asarray(g.policy)[inverse]
  for n, u in enumerate([node0, node1]):
    want = np.asarray(rl.grpo(u))
    np.testing.assert_allclose(policy[6 * n:6 * n + 6], want.ravel(), atol=1e-6)
    np.testing.assert_allclose(g.route[3 * n:3 * n + 3], want.mean(1), atol=1e-6)
  with pytest.raises(ValueError, match="estimator 'ppo'"):
    rl.row_advantages(rewards, route, valid, estimator="ppo", **kw)
