"""MoRSE's training waves on the engine (`RolloutConfig.engine`): the rollouts and the waves'
greedy merge calls on the trainer's engine give the static path's outcomes and updates."""

from __future__ import annotations

import dataclasses

import chex
import jax
import numpy as np
import pytest

from morse_jax.mas import runner
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.rl import trainer as trainer_lib
from morse_jax.tasks.base import Problem
# agents: the tiny model with routed experts; WordFamily: node "b" fails (a blocked parent).
from tests.mas.test_runner import CHAIN, DIAMOND, WordFamily, agents, make_trainer  # noqa: F401


def loud(state):
  """Experts that change the replies (init_experts' b = 0 adds nothing)."""
  keys = iter(jax.random.split(jax.random.key(4), 16))
  return dataclasses.replace(state, experts={
      t: type(e)(a=e.a * 10, b=0.5 * jax.random.normal(next(keys), e.b.shape))
      for t, e in state.experts.items()})


def outcomes(tasks):
  return [(t.problem.id, {i: (n.subtask_experts, n.context, n.artifact, n.score.reward)
                          for i, n in t.nodes.items()}, t.score) for t in tasks]


@pytest.mark.slow
def test_training_waves_on_the_engine_equal_the_static_ones(agents, monkeypatch):
  """A diamond (its merge greedy, on the engine too) and a chain, three waves, three updates."""
  trainers = [make_trainer(agents) for _ in range(2)]
  trainers[1] = trainer_lib.Trainer(
      agents.model, trainers[0].lora, trainers[0].router, trainers[0].step_config,
      dataclasses.replace(trainers[0].rollout_config, engine=True), embed_dim=agents.embed.dim)
  calls = []
  replies = type(agents).replies

  def counted(self, prompts, *args, **kwargs):  # which sampler each merge call went to
    if prompts:
      calls.append(self.sampler)
    return replies(self, prompts, *args, **kwargs)

  monkeypatch.setattr(type(agents), "replies", counted)
  probs = [Problem("p0", "words", "c", "w40 w41"), Problem("p1", "words", "c", "w42")]
  graphs = [SubtaskGraph.from_obj(DIAMOND), SubtaskGraph.from_obj(CHAIN)]
  out = []
  for trainer in trainers:
    state = loud(trainer.init_state(jax.random.key(3)))
    out.append(runner.train(trainer, state, agents, WordFamily(), probs, graphs,
                            train_merges=False, seed=5))
  (s0, o0, h0), (s1, o1, h1) = out
  assert outcomes(o1) == outcomes(o0)
  assert [m["reward_mean"] for m in h1] == [m["reward_mean"] for m in h0]
  chex.assert_trees_all_close(s1.experts, s0.experts, atol=1e-5)
  assert calls.count(None) == 1 and calls.count(trainers[1].sampler) == 1  # d's merge, twice
  assert trainers[1].sampler.fallbacks == 0
  assert agents.sampler is None  # the caller's agents are left alone
  assert np.isfinite([m["expert_loss"] for m in h1]).all()
