"""MoRSE's evaluation on the engine: the wave path's outcomes, node for node, on a tiny random
model with routed experts; no wave barrier (a scripted engine); the static sampler for a call
longer than the engine's rows or failed in it; the wave path on a mesh."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.llm.engine import Completion, EngineError
from morse_jax.lora import router
from morse_jax.mas import engine_run, runner
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.tasks.base import Problem
# agents: the tiny model with routed experts; WordFamily: node "b" fails (a blocked parent).
from tests.mas.test_runner import LORA, RCFG, WordFamily, agents  # noqa: F401 (a fixture)


def node(i, *parents):
  return {"id": i, "title": f"w1{i}", "description": f"w2{i}", "depends_on": list(parents)}


# Depths 3, 2, 1 and 4 (two merges: d, and z after a fan-out).
GRAPHS = [[node("a"), node("b", "a"), node("c", "a"), node("d", "b", "c")],
          [node("1"), node("2", "1")],
          [node("s")],
          [node("x"), node("y", "x"), node("u", "x"), node("v", "y"), node("z", "v", "u")]]


@pytest.fixture(scope="module")
def weights(agents):
  """Experts that change the replies (init_experts' b = 0 would add nothing), and a router."""
  experts = lora.init_experts(LORA, agents.model.config, jax.random.key(1))
  keys = iter(jax.random.split(jax.random.key(4), 8))
  experts = {t: lora.ExpertWeights(a=e.a * 10, b=0.5 * jax.random.normal(next(keys), e.b.shape))
             for t, e in experts.items()}
  return experts, router.init_router(RCFG, agents.embed.dim, 4, jax.random.key(2))


def batch(statements=("w40 w41", "w42", "w43 w44 w45", "w46")):
  return ([Problem(f"p{k}", "words", "c", s) for k, s in enumerate(statements)],
          [SubtaskGraph.from_obj(g) for g in GRAPHS])


def essentials(outcomes):
  """Everything of the outcomes but the wall times."""
  out = []
  for task in outcomes:
    nodes = {}
    for i, n in task.nodes.items():
      s = n.stats
      nodes[i] = (n.subtask_experts, n.context, n.artifact, n.score.reward, n.score.passed,
                  n.score.details, s.wave, s.prompt_tokens, s.context_tokens,
                  s.generated_tokens, s.cut, s.prompt)
    out.append((task.problem.id, nodes, task.score))
  return out


@pytest.mark.parametrize("merge_mode,sampling", [
    pytest.param("union", llm.GREEDY, marks=pytest.mark.slow),  # ~24 s; the sampled case stays
    ("random_subset", llm.SamplingConfig(temperature=1.0))],
    ids=["greedy-union", "sampled-random_subset"])
@pytest.mark.slow
def test_the_engine_walk_gives_the_wave_paths_outcomes(agents, weights, merge_mode, sampling):
  """Same replies, contexts, routes, rewards per node: the plan gives each call the wave path's
  route, merge experts and key (sampled rows too: the draws depend on the key alone)."""
  experts, rparams = weights
  probs, graphs = batch()
  call = dict(rng=jax.random.key(7), sampling=sampling, merge_mode=merge_mode, seed=3,
              keep_prompts=True)
  verifiers = WordFamily(), WordFamily()
  waves = runner.run(agents, verifiers[0], probs, graphs, experts, rparams, **call)
  engine = engine_run.run(agents, verifiers[1], probs, graphs, experts, rparams, slots=3, **call)
  assert essentials(engine) == essentials(waves)
  # Each verifier call saw the same upstream artifacts (in another order: no waves).
  assert sorted(map(repr, verifiers[1].calls)) == sorted(map(repr, verifiers[0].calls))
  merged = [n for t in engine for n in t.nodes.values() if n.stats.merge_seconds > 0]
  assert sorted(n.node_id for n in merged) == ["d", "z"]
  replies = {n.artifact for t in engine for n in t.nodes.values()}
  assert len(replies) > 5  # the replies differ: the comparison is not between empty texts


@pytest.mark.slow  # 18 s: the experts' case above covers the same walk
def test_the_bare_backbone_runs_on_the_engine_too(agents):
  bare = Agents(model=agents.model, lora=None, router=None, embed=None, max_new_tokens=6)
  probs, graphs = batch()
  call = dict(rng=jax.random.key(0), keep_prompts=True)
  assert essentials(engine_run.run(bare, WordFamily(), probs, graphs, None, None, **call)) == \
      essentials(runner.run(bare, WordFamily(), probs, graphs, None, None, **call))


class ScriptedEngine:
  """Each call ends after one step, a prompt that holds "w88" after eight; records events.
  fail: a call whose prompt holds this word ends in an engine error."""

  def __init__(self, agents, fail=None):
    self.agents, self.steps, self.events, self.live, self.fail = agents, 0, [], [], fail
    self.config = engine_run.EngineConfig(max_len=256)

  def submit(self, request):
    text = self.agents.model.tokenizer.decode(list(request.prompt))
    handle = ScriptedHandle(text, self.steps + (8 if "w88" in text else 1))
    if self.fail and self.fail in text:
      handle.error = EngineError("decode failed for 1 rows")
    self.events.append(("submit", text, self.steps))
    self.live.append(handle)
    return handle

  def step(self):
    self.steps += 1
    for h in self.live:
      if self.steps >= h.end and not h.done:
        h.done = True
        self.events.append(("done", h.text, self.steps))


class ScriptedHandle:
  def __init__(self, text, end):
    self.text, self.end, self.done, self.error = text, end, False, None

  def result(self):
    return Completion(np.asarray([6], np.int32), np.zeros(1, np.float32), "length")


def test_a_task_advances_while_another_tasks_slow_node_runs(agents, monkeypatch):
  """Task A's chain 1 -> 2 -> 3 is done while task B's only node (slow) still decodes: the wave
  path would hold A's second node until B's first wave ended."""
  engine = ScriptedEngine(agents)
  monkeypatch.setattr(engine_run, "build_engine", lambda *a: (engine, {}))
  bare = Agents(model=agents.model, lora=None, router=None, embed=None, max_new_tokens=6)
  probs = [Problem("A", "words", "c", "w40"), Problem("B", "words", "c", "w88")]
  graphs = [SubtaskGraph.from_obj([node("1"), node("2", "1"), node("3", "2")]),
            SubtaskGraph.from_obj([node("s")])]
  out = engine_run.run(bare, WordFamily(), probs, graphs, None, None, rng=jax.random.key(0))
  b_done = next(s for e, text, s in engine.events if e == "done" and "w88" in text)
  a_submits = [s for e, text, s in engine.events if e == "submit" and "w88" not in text]
  assert len(a_submits) == 3 and max(a_submits) < b_done
  assert [len(t.nodes) for t in out] == [3, 1]
  assert [n.stats.wave for n in out[0].nodes.values()] == [0, 1, 2]


@pytest.mark.slow  # 14 s: a static sampler compile of its own
def test_a_call_longer_than_the_engines_rows_runs_on_the_static_sampler(agents, weights,
                                                                        monkeypatch, caplog):
  experts, rparams = weights
  probs, graphs = batch()
  probs, graphs = probs[:2], graphs[:2]
  call = dict(rng=jax.random.key(7), keep_prompts=True)
  waves = runner.run(agents, WordFamily(), probs, graphs, experts, rparams, **call)
  # Rows that hold the roots' executor calls, not the longer merge and child prompts.
  root = max(len(runner.executor_prompt(agents, WordFamily(), t, t.graph.node(i), ""))
             for t in waves for i in t.graph.topological_order() if not t.graph.parents(i))
  row = root + agents.max_new_tokens
  monkeypatch.setattr(engine_run, "row_sizes", lambda *a: (row, row))
  with caplog.at_level("WARNING"):
    engine = engine_run.run(agents, WordFamily(), probs, graphs, experts, rparams, **call)
  assert essentials(engine) == essentials(waves)
  assert "goes to the static sampler" in caplog.text


def test_a_call_the_engine_fails_runs_on_the_static_sampler(agents, monkeypatch, caplog):
  """Task B's executor call fails in the engine: its node gets the static sampler's reply (the
  wave path's), task A the scripted engine's."""
  engine = ScriptedEngine(agents, fail="w88")
  monkeypatch.setattr(engine_run, "build_engine", lambda *a: (engine, {}))
  bare = Agents(model=agents.model, lora=None, router=None, embed=None, max_new_tokens=6)
  probs = [Problem("A", "words", "c", "w40"), Problem("B", "words", "c", "w88")]
  graphs = [SubtaskGraph.from_obj([node("1")]), SubtaskGraph.from_obj([node("s")])]
  with caplog.at_level("WARNING"):
    out = engine_run.run(bare, WordFamily(), probs, graphs, None, None, rng=jax.random.key(0))
  [waves] = runner.run(bare, WordFamily(), probs[1:], graphs[1:], None, None,
                       rng=jax.random.key(0))
  assert out[1].nodes["s"].artifact == waves.nodes["s"].artifact != bare.decode([6])
  assert out[0].nodes["1"].artifact == bare.decode([6])
  assert "the engine failed it" in caplog.text


def test_agents_on_a_mesh_of_several_devices_keep_the_wave_path(agents, monkeypatch):
  """The engine does not shard: such a batch goes to `runner.run` with the same call."""
  calls = []
  monkeypatch.setattr(runner, "run", lambda *a, **k: calls.append((a, k)) or "waves")
  on_mesh = Agents(model=agents.model, lora=None, router=None, embed=None,
                   mesh=types.SimpleNamespace(size=2))
  probs, graphs = batch()
  assert engine_run.run(on_mesh, WordFamily(), probs, graphs, None, None,
                        rng=jax.random.key(0), seed=5) == "waves"
  assert calls[0][0][2] == probs and calls[0][1]["seed"] == 5


def test_the_pool_holds_every_slot_at_a_typical_size_and_one_full_row(agents):
  bare = Agents(model=agents.model, lora=None, router=None, embed=None, max_new_tokens=6)
  engine, routes = engine_run.build_engine(bare, None, {}, 4, 256, 64)
  page = engine_run.PAGE_SIZE
  assert engine.config.num_pages == 4 * 64 // page + 256 // page + 1 and routes == {}
  # Rows that are all full-sized need no more than the default pool.
  engine, _ = engine_run.build_engine(bare, None, {}, 2, 256, 256)
  assert engine.config.num_pages == 2 * 256 // page + 1
