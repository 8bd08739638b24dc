"""The committed APEx toy (assets/toy_apex): a Hugging Face folder transformers reads with our
logits, and on a world it never saw (new names) the real Executor, greedy, searches with a
well-formed call and answers in the protocol."""

import os

import jax
import numpy as np
import pytest

from apex_jax.agents import AgentConfig, Executor, SeparateGenerator
from apex_jax.datasets.world import World
from apex_jax.tools.overlap import WordSearch
from morse_jax import llm
from tests.apex.toy.conftest import REPO

PATH = os.path.join(REPO, "assets", "toy_apex")


@pytest.fixture(scope="module")
def toy():
  return llm.load(PATH)


def test_transformers_reads_the_same_model(toy):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  ids = toy.tokenizer.apply_chat_template([{"role": "user", "content": "Who directed Funlol?"}],
                                          add_generation_prompt=True)
  hf_tok = AutoTokenizer.from_pretrained(PATH)
  assert hf_tok.apply_chat_template([{"role": "user", "content": "Who directed Funlol?"}],
                                    add_generation_prompt=True, tokenize=True,
                                    return_dict=False) == ids
  ours, _ = llm.forward(toy.params, toy.config, np.asarray([ids]))
  theirs = AutoModelForCausalLM.from_pretrained(PATH).eval()(torch.tensor([ids])).logits
  np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), atol=2e-4)


@pytest.mark.slow
def test_executor_follows_the_protocol_on_a_new_world(toy):
  world = World.generate(4242, 120, 8)
  config = AgentConfig(prompts="compact", temperature=0.0, topk=2, max_turns=5,
                       max_llm_calls=10, executor_max_new_tokens=80,
                       max_context_tokens=toy.config.max_position_embeddings)
  generator = SeparateGenerator({"executor": (toy, None, None)})
  runs = Executor(generator, WordSearch(world.passages, 2), config).run(
      [e.question for e in world.examples], rng=jax.random.key(0))
  assert all(r.stats.get("tool_calls", 0) >= 1 for r in runs), [r.stats for r in runs]
  assert sum(r.answer is not None for r in runs) >= 6, [r.info["turns"] for r in runs]
  assert all(r.stats.get("format_errors", 0) == 0 for r in runs), [r.stats for r in runs]


@pytest.mark.slow  # 17 s of judge-prompt compiles; the default run is near its 10-minute budget
def test_toy_judges_runs_in_the_judges_formats(toy):
  """The demo's in-process TTRL judges (the toy itself) on gold and corrupted runs of a new world:
  every evaluator reply has a score, every arbiter reply a verdict, every alignment reply a
  number (apex_jax.toy.judging's conversations teach it the formats)."""
  from apex_jax.toy.judge_eval import judge_metrics

  m = judge_metrics(toy, world_seed=4242, questions=40, topk=2, runs=2)
  assert m["runs"] == m["alignment_plans"] == 2
  for kind in ("evaluator_failures", "arbiter_failures", "alignment_failures"):
    assert sum(m[kind].values()) == 0, m
  assert sum(m["arbiter_verdicts"].values()) == 2, m
