"""The shared-prefix layout of the update: every token keeps its own context, and the step on it
equals the step on the rows."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from morse_jax.lora import mixture
from morse_jax.rl import compaction
from morse_jax.rl import rollout as rl_rollout
from morse_jax.rl import train_step as ts
from tests.rl.test_train_step import BASE, EMB_DIM, RCFG, REWARDS, run_steps, setup  # noqa: F401


def toy_batch(rows, route, experts, valid=None):
  p = rl_rollout.pack([[rl_rollout.Segment(prompt), rl_rollout.Segment(gen, [-1.0] * len(gen))]
                       for prompt, gen in rows])
  n = len(rows)
  return ts.PolicyBatch(
      tokens=p.tokens, attention_mask=p.attention_mask, loss_mask=p.loss_mask,
      logp_old=p.logp_old, rewards=np.zeros(n, np.float32), route=np.asarray(route, np.int32),
      valid=np.ones(n, np.float32) if valid is None else np.asarray(valid, np.float32),
      routes=mixture.uniform_routes(experts, 3))


def visible(shared, p, s):
  """The slots that slot s of packed row p attends to, in order (the model's block mask)."""
  seg = shared.segments[p]
  return [j for j in range(s + 1) if seg[j] >= 0 and (seg[j] == 0 or seg[j] == seg[s])]


def test_every_token_keeps_its_context_and_position():
  rows = [([5, 6, 7, 8], [20, 21, 22]),  # route 0: two candidates that begin alike
          ([5, 6, 7, 8], [20, 21, 30, 31]),
          ([5, 6, 7, 8], [40]),  # route 1: the same prompt, other experts
          ([9, 10], [50, 51]),  # route 3
          ([5, 6, 7, 8], [20])]  # an invalid (padding) row
  experts = [[0, 2, 3]] * 2 + [[0, 4, 5]] + [[1, 4, 5]] * 2
  batch = toy_batch(rows, [0, 0, 1, 3, 0], experts, valid=[1, 1, 1, 1, 0])
  out = jax.tree.map(np.asarray, compaction.share_prefixes(batch))
  shared = out.shared
  assert shared.tokens.shape == (4, 16)  # 3 routes (padded to 4 rows); 11 slots (bucket 16)
  # Route 0's prefix is its prompt: the candidates' common tokens 20, 21 are trained, so each
  # keeps its own copy.
  np.testing.assert_array_equal(shared.tokens[0, :11], [5, 6, 7, 8, 20, 21, 22, 20, 21, 30, 31])
  np.testing.assert_array_equal(shared.segments[0], [0] * 4 + [1] * 3 + [2] * 4 + [-1] * 5)
  np.testing.assert_array_equal(shared.positions[0, :11], [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7])
  assert (shared.segments[3] == -1).all()
  assert out.loss_mask.shape == (5, 16)  # the rows' arrays hold their suffixes
  for r in range(4):
    p, size = shared.row[r], int(out.attention_mask[r].sum())
    length = int(batch.attention_mask[r].sum())
    prefix = length - size
    np.testing.assert_array_equal(shared.routes.idx[p], batch.routes.idx[r])
    for key in ("tokens", "loss_mask", "logp_old"):
      np.testing.assert_array_equal(getattr(out, key)[r, :size],
                                    getattr(batch, key)[r, prefix:length])
    assert out.loss_mask[r].sum() == batch.loss_mask[r].sum()  # every trained token is kept
    for j in range(size):
      s = shared.col[r, j]
      assert shared.tokens[p, s] == out.tokens[r, j] and shared.positions[p, s] == prefix + j
      context = [shared.tokens[p, i] for i in visible(shared, p, s)]
      np.testing.assert_array_equal(context, batch.tokens[r, :prefix + j + 1])
      prev = shared.prev[p, s]  # the slot that predicts it holds the row's previous token
      assert shared.tokens[p, prev] == batch.tokens[r, prefix + j - 1]
      assert prev in visible(shared, p, s)
  assert shared.row[4] == 0 and not out.loss_mask[4].any()  # invalid rows train nothing
  with pytest.raises(ValueError, match="a row has 4 tokens after its group's prefix, more than "
                                       "width=3"):
    compaction.share_prefixes(batch, width=3)


def test_a_group_with_two_routes_is_refused():
  batch = toy_batch([([5, 6], [7]), ([5, 6], [8])], [0, 0], [[0, 2, 3], [0, 2, 4]])
  with pytest.raises(ValueError, match=r"rows 0 and 1 of route 0 have different experts"):
    compaction.share_prefixes(batch)
  shared = compaction.share_prefixes(dataclasses.replace(batch, route=np.asarray([0, 1])))
  with pytest.raises(ValueError, match="already has a shared-prefix layout"):
    compaction.without_flat_nodes(shared, routes_per_node=1, aggregation="token-mean")


@pytest.mark.slow
def test_step_on_shared_prefixes_equals_step_on_rows(setup):  # noqa: F811
  """Seq-mean aggregation with a KL term: per-row weights, log-probs, reference and entropy all
  go through the gather back to the rows."""
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  shared = compaction.share_prefixes(batch)
  assert shared.shared.tokens.size < batch.tokens.size
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  ref, got = (run_steps(backbone, experts, b, rb, 2, BASE) for b in (batch, shared))
  for epoch in (0, 1):
    for key in ("expert_loss", "expert_grad_norm", "clip_frac", "kl", "entropy", "router_loss"):
      np.testing.assert_allclose(got[3][epoch][key], ref[3][epoch][key], rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(got[:3], ref[:3], rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="micro_batches=2 with PolicyBatch.shared"):
    run_steps(backbone, experts, shared, rb, 1, dataclasses.replace(BASE, micro_batches=2))


def test_sum_norm_needs_a_constant_length(setup):  # noqa: F811
  """Dr. GRPO divides by a constant: not the padded width, which the layouts change."""
  backbone, experts, out = setup
  batch = rl_rollout.policy_batch(out, REWARDS)
  rb = rl_rollout.router_batch(out, RCFG.top_k, EMB_DIM)
  with pytest.raises(ValueError, match="needs StepConfig.norm_len"):
    run_steps(backbone, experts, batch, rb, 1,
              dataclasses.replace(BASE, aggregation="seq-mean-token-sum-norm"))
