"""LoRA-and-router-only orbax checkpoints: round trip, latest step, clear errors."""

import json
import re

import jax
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora import checkpoint, router

MODEL = llm.LlmConfig("llama", 32, 16, 32, 2, 2, 1, 8)
LORA = lora.LoraConfig(last_n_layers=1, rank=2)


def trainables(seed):
  experts = lora.init_experts(LORA, MODEL, jax.random.key(seed))
  experts = jax.tree.map(lambda a: a + seed, experts)
  return experts, router.init_router(router.RouterConfig(dim=4), 16, 4, jax.random.key(seed))


def test_round_trip_and_latest(tmp_path):
  for step in (1, 2):
    experts, params = trainables(step)
    checkpoint.save(str(tmp_path), step, experts, params, {"step": step, "note": "x"},
                    max_to_keep=2)
  like = trainables(0)
  experts, params, meta = checkpoint.restore(str(tmp_path), *like)
  want = trainables(2)
  for got, ref in zip(jax.tree.leaves((experts, params)), jax.tree.leaves(want)):
    np.testing.assert_array_equal(got, ref)
  assert meta == {"step": 2, "note": "x"}
  older, _, _ = checkpoint.restore(str(tmp_path), *like, step=1)
  np.testing.assert_array_equal(older["q"].a, trainables(1)[0]["q"].a)


def test_mismatch_and_missing_are_clear_errors(tmp_path):
  checkpoint.save(str(tmp_path), 3, *trainables(3))
  with pytest.raises(checkpoint.AdapterCheckpointError, match="no checkpoint at step 7"):
    checkpoint.restore(str(tmp_path), *trainables(0), step=7)
  bigger = lora.init_experts(lora.LoraConfig(last_n_layers=1, rank=3), MODEL, jax.random.key(0))
  with pytest.raises(checkpoint.AdapterCheckpointError, match="step 3"):
    checkpoint.restore(str(tmp_path), bigger, trainables(0)[1])
  # The good checkpoint is still there and readable.
  experts, _, _ = checkpoint.restore(str(tmp_path), *trainables(0))
  np.testing.assert_array_equal(experts["v"].b, trainables(3)[0]["v"].b)


def test_damaged_array_is_refused_naming_step_and_array(tmp_path):
  checkpoint.save(str(tmp_path), 3, *trainables(3))
  saved = tmp_path / "3" / "checksums" / "metadata"
  doc = json.loads(saved.read_text())
  name = sorted(doc["arrays"])[0]
  # The same as a flipped bit in that array's data: the bytes no longer match the checksum.
  doc["arrays"][name]["sha256"] = "0" * 64
  saved.write_text(json.dumps(doc))
  with pytest.raises(checkpoint.AdapterCheckpointError,
                     match=rf"step 3: array {re.escape(name)} does not match its checksum"):
    checkpoint.restore(str(tmp_path), *trainables(0))
