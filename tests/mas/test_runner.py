"""The runner on a tiny random model: waves, merges, blocking, and training waves."""

import jax
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora import embedders, router
from morse_jax.mas import runner
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.rl import train_step as ts
from morse_jax.rl import trainer as trainer_lib
from morse_jax.tasks.base import NodeScore, Problem, ProblemScore
from tests import tiny_models

LORA = lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=4)
RCFG = router.RouterConfig(dim=8, top_k=2)
DIAMOND = [{"id": "a", "title": "w10", "description": "w11", "depends_on": []},
           {"id": "b", "title": "w12", "description": "w13", "depends_on": ["a"]},
           {"id": "c", "title": "w14", "description": "w15", "depends_on": ["a"]},
           {"id": "d", "title": "w16", "description": "w17", "depends_on": ["b", "c"]}]
CHAIN = [{"id": "1", "title": "w20", "description": "w21", "depends_on": []},
         {"id": "2", "title": "w22", "description": "w23", "depends_on": ["1"]}]


class WordFamily:
  """Reward: the share of even-numbered words; node "b" always fails (to test blocking)."""

  name = "words"

  def __init__(self):
    self.calls = []

  def executor_instructions(self, problem, node):
    return "w30 w31"

  def score_node(self, problem, node, artifact, upstream):
    words = artifact.split()
    reward = float(np.mean([int(w[1:]) % 2 == 0 for w in words if w[1:].isdigit()] or [0.0]))
    self.calls.append((problem.id, node["id"], dict(upstream), reward))
    return NodeScore(reward=reward, passed=node["id"] != "b")

  def score_problem(self, problem, artifacts):
    return ProblemScore(passed=all(a is not None for a in artifacts.values()),
                        metrics={"nodes": len(artifacts)})


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
  folder, _ = tiny_models.save_hf_model("llama", str(tmp_path_factory.mktemp("runner")))
  model = llm.load(folder)
  embed = embedders.BackboneMeanEmbedder(model.params.embed, model.tokenizer)
  return Agents(model=model, lora=LORA, router=RCFG, embed=embed, max_new_tokens=6,
                kernel="gather")


def problems():
  return ([Problem("p0", "words", "c", "w40 w41"), Problem("p1", "words", "c", "w42")],
          [SubtaskGraph.from_obj(DIAMOND), SubtaskGraph.from_obj(CHAIN)])


def test_inference_waves_merges_and_blocking(agents, monkeypatch):
  experts = lora.init_experts(LORA, agents.model.config, jax.random.key(1))
  rparams = router.init_router(RCFG, agents.embed.dim, 4, jax.random.key(2))
  calls = []
  generate = agents.generate
  monkeypatch.setattr(agents, "generate", lambda p, s, *a, **k: calls.append(s) or
                      generate(p, s, *a, **k))
  family = WordFamily()
  probs, graphs = problems()
  out = runner.run(agents, family, probs, graphs, experts, rparams, rng=jax.random.key(0))
  # Waves: {a, 1}, {b, c, 2}, {d}; each wave = one merge call (maybe empty) + one executor call.
  executor_calls = [c for c in calls if c and c[0][0] == 0]
  assert [len(c) for c in executor_calls] == [2, 3, 1]
  merge_calls = [c for c in calls if c and c[0][0] == 1]
  assert len(merge_calls) == 1 and len(merge_calls[0]) == 1  # only d has two parents
  b, c = out[0].nodes["b"], out[0].nodes["c"]
  assert merge_calls[0][0] == [1] + sorted({e + 2 for e in b.subtask_experts + c.subtask_experts})
  assert out[1].nodes["2"].context == out[1].nodes["1"].artifact  # one parent: its artifact
  assert not out[0].nodes["b"].score.passed and out[0].score.passed is False
  assert out[1].score.passed
  # The verifier of d sees a and c, not the blocked b.
  assert [u for p, n, u, _ in family.calls if n == "d"][0].keys() == {"a", "c"}
  assert len(out[0].step_rewards()) == 4


def make_trainer(agents):
  return trainer_lib.Trainer(
      agents.model.params, agents.model.config, LORA, RCFG,
      ts.StepConfig(expert_lr=1e-2, router_lr=1e-2),
      trainer_lib.RolloutConfig(routes_per_node=2, group_size=2, max_new_tokens=6,
                                kernel="gather"), embed_dim=agents.embed.dim,
      eos_ids=agents.model.stop_ids, pad_id=agents.model.tokenizer.pad_id)


def test_training_waves_update_and_pick_the_best(agents):
  trainer = make_trainer(agents)
  state = trainer.init_state(jax.random.key(3))
  family = WordFamily()
  # Two chains: every wave has two nodes, so the two updates share their compiled shapes.
  probs = [Problem("p0", "words", "c", "w40 w41"), Problem("p1", "words", "c", "w42")]
  graphs = [SubtaskGraph.from_obj(CHAIN)] * 2
  state, out, history = runner.train(trainer, state, agents, family, probs, graphs)
  assert int(state.step) == 2 and [m["wave"] for m in history] == [0, 1]
  assert all(np.isfinite(m["expert_loss"]) for m in history)
  # Every candidate was scored (4 per node), and each node kept its best one.
  assert len(family.calls) == 4 * 4
  for task in out:
    for node_id, outcome in task.nodes.items():
      rewards = [r for p, n, _, r in family.calls if (p, n) == (task.problem.id, node_id)]
      assert len(rewards) == 4 and outcome.score.reward == max(rewards)
  assert all(len(o.subtask_experts) == 2 for t in out for o in t.nodes.values())


def test_training_skips_nodes_behind_a_blocked_parent(agents):
  trainer = make_trainer(agents)
  state = trainer.init_state(jax.random.key(3))
  family = WordFamily()  # node "b" never passes
  blocked = [{"id": "b", "title": "w20", "description": "w21", "depends_on": []},
             {"id": "x", "title": "w22", "description": "w23", "depends_on": ["b"]}]
  probs = [Problem("p0", "words", "c", "w40 w41"), Problem("p1", "words", "c", "w42")]
  graphs = [SubtaskGraph.from_obj(blocked)] * 2
  state, out, history = runner.train(trainer, state, agents, family, probs, graphs,
                                     skip_blocked=True)
  assert int(state.step) == 1 and [m["wave"] for m in history] == [0]  # wave 1 had no live node
  assert {n for _, n, _, _ in family.calls} == {"b"}
  for task in out:
    x = task.nodes["x"]
    assert not x.score.passed and x.score.reward == 0.0 and x.artifact == ""
    assert x.score.details["reason"] == "blocked: parent 'b' failed"
