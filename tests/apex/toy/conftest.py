"""A small world, its compact and authors'-style corpora, and the committed toy's tokenizer (the
ChatML template the toy is trained and run with), shared per module."""

import os

import pytest

from apex_jax.agents.config import AgentConfig
from apex_jax.datasets.world import World
from apex_jax.toy import build

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
COMPACT = AgentConfig(prompts="compact")


@pytest.fixture(scope="package")
def world():
  return World.generate(7, 60, 80)


@pytest.fixture(scope="package")
def compact(world):
  return build.world_turns(world, COMPACT, seed=7)


@pytest.fixture(scope="package")
def authors(world):
  return build.world_turns(world, AgentConfig(), seed=7)


@pytest.fixture(scope="package")
def toy_tok():
  from transformers import AutoTokenizer

  from morse_jax import llm

  path = os.path.join(REPO, "assets", "toy_qwen3")
  return llm.Tokenizer(AutoTokenizer.from_pretrained(path), path)
