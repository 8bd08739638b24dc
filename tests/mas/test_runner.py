"""The runner on a tiny random model: waves, merges, blocking, what it measures per node, the
evaluation records, and training waves (merge calls included)."""

import dataclasses
import json
import zlib

import jax
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora import embedders, router
from morse_jax.experiments import records
from morse_jax.mas import prompts, runner
from morse_jax.mas.agents import Agents, Reply
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.rl import advantages
from morse_jax.rl import rollout as rollout_lib
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
    passed = node["id"] != "b"
    return NodeScore(reward=reward, passed=passed, details={} if passed else {"reason": "b fails"})

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


@pytest.mark.slow
def test_inference_waves_merges_and_blocking(agents, monkeypatch):
  experts = lora.init_experts(LORA, agents.model.config, jax.random.key(1))
  rparams = router.init_router(RCFG, agents.embed.dim, 4, jax.random.key(2))
  calls = []
  replies = agents.replies  # merges (through generate) and executors both end here
  monkeypatch.setattr(agents, "replies", lambda p, s, *a, **k: calls.append(s) or
                      replies(p, s, *a, **k))
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


def test_replies_count_tokens_and_tell_the_limit_from_a_stop(agents, monkeypatch):
  """The sampler's rows as it reports them (tokens, lengths with the stop token counted), so
  that every case is certain without compiling one sampler per stop set."""
  stop, word = agents.model.stop_ids[0], int(agents.model.tokenizer.encode("w5")[0])
  rows = [[word, word, word],  # the limit: cut
          [word, stop, 0],  # a stop before the limit
          [word, word, stop],  # a stop as the limit's last token: a stop, not a cut
          [word, 0, 0]]  # one token, then (after the stop, unseen) padding
  lengths = [3, 2, 3, 1]
  seen = {}

  def sample(model, prompts, settings, **kwargs):
    seen.update(max_new_tokens=settings.max_new_tokens, eos_ids=settings.eos_ids)
    return llm.SampleOutput(np.asarray(rows, np.int32), np.zeros((4, 3), np.float32),
                            np.asarray(lengths, np.int32))

  monkeypatch.setattr(llm, "sample", sample)
  out = agents.replies([[5]] * 4, None, rng=jax.random.key(0), max_new_tokens=3)
  assert [(r.tokens, r.cut) for r in out] == [(3, True), (2, False), (3, False), (1, False)]
  assert [r.text for r in out] == ["w5 w5 w5", "w5", "w5 w5", "w5"]
  assert seen == {"max_new_tokens": 3, "eos_ids": agents.model.stop_ids}
  assert agents.generate([[5]] * 4, None, rng=jax.random.key(0), max_new_tokens=3) == [
      r.text for r in out]


RECORD_KEYS = {"kind", "problem_id", "node_id", "title", "wave", "route", "prompt_tokens",
               "context_tokens", "generated_tokens", "cut", "reward", "passed", "reason", "reply",
               "code", "details", "merge_seconds", "wave_seconds", "score_seconds"}


def test_run_measures_each_node_and_records_say_why_it_failed(agents, tmp_path):
  experts = lora.init_experts(LORA, agents.model.config, jax.random.key(1))
  rparams = router.init_router(RCFG, agents.embed.dim, 4, jax.random.key(2))
  family = WordFamily()
  probs, graphs = problems()
  out = runner.run(agents, family, probs, graphs, experts, rparams, rng=jax.random.key(0),
                   keep_prompts=True)
  path = tmp_path / "eval_test.jsonl"
  assert records.write(str(path), out, prompts=True) == 8
  lines = [json.loads(line) for line in path.read_text().splitlines()]
  assert [(r["kind"], r["problem_id"], r.get("node_id")) for r in lines] == [
      ("node", "p0", "a"), ("node", "p0", "b"), ("node", "p0", "c"), ("node", "p0", "d"),
      ("problem", "p0", None), ("node", "p1", "1"), ("node", "p1", "2"), ("problem", "p1", None)]
  nodes = {(r["problem_id"], r["node_id"]): r for r in lines if r["kind"] == "node"}
  for (pid, node_id), r in nodes.items():
    outcome = out[int(pid[1])].nodes[node_id]
    assert set(r) == RECORD_KEYS | {"prompt"}
    assert r["reply"] == outcome.artifact and r["route"] == outcome.subtask_experts
    assert len(r["route"]) == 2 and r["reward"] == outcome.score.reward
    assert 1 <= r["generated_tokens"] <= 6 and r["cut"] == outcome.stats.cut
    assert r["wave_seconds"] > 0 and r["score_seconds"] >= 0
    if pid == "p0":  # the chat-templated text, special tokens shown
      assert "w40 w41" in r["prompt"] and r["prompt"].endswith("<|assistant|>")
  assert [nodes["p0", i]["wave"] for i in "abcd"] == [0, 1, 1, 2]
  # Only wave 2 (node d, two parents) has a merge call.
  assert [nodes["p0", i]["merge_seconds"] > 0 for i in "abcd"] == [False, False, False, True]
  # The failed node says why; passed ones carry no reason.
  assert (nodes["p0", "b"]["passed"], nodes["p0", "b"]["reason"]) == (False, "b fails")
  assert nodes["p0", "a"]["reason"] is None and nodes["p0", "a"]["passed"]
  # Prompt and context lengths, counted independently of the runner.
  a = graphs[0].node("a")
  prompt = agents.tokens(prompts.executor("w40 w41", a, "", "w30 w31"))
  assert (nodes["p0", "a"]["prompt_tokens"], nodes["p0", "a"]["context_tokens"]) == (len(prompt), 0)
  assert nodes["p1", "2"]["context_tokens"] == len(agents.model.tokenizer.encode(
      out[1].nodes["1"].artifact))
  by_problem = {r["problem_id"]: r for r in lines if r["kind"] == "problem"}
  assert by_problem["p0"] == {"kind": "problem", "problem_id": "p0", "passed": False,
                              "steps_passed": 3, "steps": 4, "metrics": {"nodes": 4}}
  assert (by_problem["p1"]["passed"], by_problem["p1"]["steps_passed"]) == (True, 2)
  # Without the flag no prompt; outcomes without stats (training's) give nulls, not errors.
  assert "prompt" not in next(records.records(out))
  bare = runner.TaskOutcome(probs[1], graphs[1], {i: dataclasses.replace(o, stats=None)
                                                   for i, o in out[1].nodes.items()})
  first = next(records.records([bare], prompts=True))
  assert first["wave"] is None and first["prompt"] is None and first["reason"] is None


def make_trainer(agents):
  return trainer_lib.Trainer(
      agents.model, LORA, RCFG, ts.StepConfig(expert_lr=1e-2, router_lr=1e-2),
      trainer_lib.RolloutConfig(routes_per_node=2, group_size=2, max_new_tokens=6,
                                kernel="gather"), embed_dim=agents.embed.dim)


@pytest.mark.slow
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


# Training the Merger: at a node with several parents each executor row gets its own merge
# sample, and the merge rows join the wave's one update with the executor rows' advantages.
# Wave 0: a and b (no merge); wave 1: d merges a and b.
JOIN = [{"id": "a", "title": "w10", "description": "w11", "depends_on": []},
        {"id": "b", "title": "w12", "description": "w13", "depends_on": []},
        {"id": "d", "title": "w16", "description": "w17", "depends_on": ["a", "b"]}]
MERGE = LORA.role_index("merge")


class HashFamily:
  """Reward: a checksum of the artifact, so two different candidates almost surely differ."""

  name = "hash"

  def executor_instructions(self, problem, node):
    return "w30"

  def score_node(self, problem, node, artifact, upstream):
    return NodeScore(reward=(zlib.crc32(artifact.encode()) % 1000) / 999, passed=True)

  def score_problem(self, problem, artifacts):
    return ProblemScore(passed=True, metrics={})


def merge_expert(experts):
  return [np.asarray(experts[t].b[:, MERGE]) for t in LORA.targets]


@pytest.mark.slow
def test_merge_rows_train_the_merge_expert_with_their_executors_advantages(agents, monkeypatch):
  trainer = make_trainer(agents)
  state = trainer.init_state(jax.random.key(5))
  updates, steps, states = [], [], []
  policy_batch, jitted, step = (rollout_lib.policy_batch, trainer_lib.ts.jitted, trainer.step)

  def record_batch(rollout, rewards):
    batch = policy_batch(rollout, rewards)
    updates.append((rollout, batch))
    return batch

  def record_step(state, *args, **kwargs):
    before = jax.device_get(state.experts)  # the step donates the state's arrays
    out = step(state, *args, **kwargs)
    states.append((before, out[0].experts, out[1]))
    return out

  monkeypatch.setattr(rollout_lib, "policy_batch", record_batch)
  monkeypatch.setattr(trainer_lib.ts, "jitted", lambda donate: (
      lambda *a, **k: steps.append(1) or jitted(donate)(*a, **k)))
  monkeypatch.setattr(trainer, "step", record_step)
  state, out, history = runner.train(trainer, state, agents, HashFamily(),
                                     [Problem("p0", "hash", "c", "w40 w41")],
                                     [SubtaskGraph.from_obj(JOIN)])
  assert [m["wave"] for m in history] == [0, 1] and len(steps) == 2  # one jitted step a wave
  assert [m["merge_rows"] for m in history] == [0, 4]

  # Wave 0 has no merge node: the merge expert gets no gradient, so it does not move at all.
  before, after, _ = states[0]
  for x, y in zip(merge_expert(before), merge_expert(after)):
    np.testing.assert_array_equal(x, y)

  # Wave 1: node d's executor rows (node 0) and its merge rows (node 1), one batch.
  update, batch = updates[1]
  execute, merge = update.requests
  assert (execute.role, merge.role, merge.routed) == ("execute", "merge", False)
  parents = out[0].nodes["a"].subtask_experts + out[0].nodes["b"].subtask_experts
  assert merge.routes == [sorted(set(parents))] * 2  # the union, on both routes (B = 2)
  per_node = 4  # B x M = 2 x 2
  for j in range(per_node):  # merge row j is executor row j's context
    text = agents.decode(update.completions[per_node + j]).strip()
    assert text in agents.decode(execute.row_prompts[j])
    assert update.expert_sets[per_node + j] == [MERGE] + [2 + e for e in merge.routes[j // 2]]
  rewards = np.asarray(batch.rewards)
  np.testing.assert_array_equal(rewards[per_node:2 * per_node], rewards[:per_node])
  adv = np.asarray(advantages.row_advantages(
      batch.rewards, batch.route, batch.valid, num_nodes=update.num_nodes,
      routes_per_node=2).policy)
  # By hand, M = 2: A_within = (u - mu_b) / (sigma_b + eps) is +-1 (less eps) or 0 on a tie.
  u = rewards[:per_node].reshape(2, 2)
  spread = np.abs(u[:, :1] - u[:, 1:]) / 2
  expected = np.where(spread > 0, (u - u.mean(1, keepdims=True)) / (spread + advantages.EPS), 0)
  if u.std() < advantages.MIN_REWARD_STD:  # a flat node has no signal at all
    expected = 0 * expected
  np.testing.assert_allclose(adv[per_node:2 * per_node], expected.ravel(), atol=1e-6)
  np.testing.assert_allclose(adv[:per_node], expected.ravel(), atol=1e-6)
  assert np.abs(expected).max() == pytest.approx(1.0, abs=1e-4)  # the checksum splits a route

  # With signal on its rows, the merge expert moved; the router saw no merge route.
  before, after, _ = states[1]
  assert max(float(np.abs(x - y).max())
             for x, y in zip(merge_expert(before), merge_expert(after))) > 1e-4
  rbatch = rollout_lib.router_batch(update, 2, agents.embed.dim)
  np.testing.assert_array_equal(np.asarray(rbatch.mask)[:4], [1, 1, 0, 0])
  d = out[0].nodes["d"]
  best = int(np.argmax(rewards[:per_node]))
  assert d.context == agents.decode(update.completions[per_node + best])


def test_bad_merge_calls_are_named(agents):
  trainer = make_trainer(agents)
  state = trainer.init_state(jax.random.key(5))
  emb, no_rewards = np.ones(agents.embed.dim, np.float32), lambda rollout: None
  one_route = trainer_lib.MergeCall([8, 9], [[0, 1]], lambda j, tokens: [8])
  with pytest.raises(ValueError, match="node 1 has a merge with 1 routes, routes_per_node is 2"):
    trainer.step(state, [trainer_lib.TrainNode([8], embedding=emb),
                         trainer_lib.TrainNode(embedding=emb, merge=one_route)], no_rewards)
  with pytest.raises(ValueError, match="node 0 has an empty prompt and no merge"):
    trainer.step(state, [trainer_lib.TrainNode(embedding=emb)], no_rewards)


class PrefixFamily(WordFamily):
  """WordFamily whose executor replies start with "w50 w51 " (a reply_prefix)."""

  def reply_prefix(self, problem, node):
    return "w50 w51 "


def test_reply_prefix_ends_the_prompt_and_starts_the_artifact(agents, monkeypatch):
  bare = dataclasses.replace(agents, lora=None, router=None, embed=None)
  seen = []

  def replies(prompts_, sets, *args, **kwargs):
    seen.extend(prompts_)
    return [Reply("w52", 1, False) for _ in prompts_]

  monkeypatch.setattr(bare, "replies", replies)
  probs, _ = problems()
  single = [SubtaskGraph.from_obj(CHAIN[:1])]
  family = PrefixFamily()
  out = runner.run(bare, family, probs[:1], single, None, None, rng=jax.random.key(0))
  prefix = bare.model.tokenizer.encode("w50 w51 ")
  assert seen[0][-len(prefix):] == prefix
  assert seen[0][:-len(prefix)] == runner.executor_prompt(
      bare, WordFamily(), out[0], single[0].nodes[0], "")
  assert out[0].nodes["1"].artifact == "w50 w51 w52"
  assert family.calls[0][3] == pytest.approx(2 / 3)  # scored with the prefix: w50, w52 even
