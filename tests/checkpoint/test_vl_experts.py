"""A Qwen2.5-VL executor's experts through checkpoints: they are LoRA on its language model, so a
`TrainState` of them saves and restores as a text model's do (checked here, not new code), the
run's metadata records the whole VlConfig (a text backbone's experts of the same shapes are
refused), and restored experts give the same log-probs on image rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import lora
from morse_jax.checkpoint.steps import CheckpointError, Checkpoints
from morse_jax.lora.experts import adapter_of
from morse_jax.llm import vl
from morse_jax.rl import vl_inputs
from morse_jax.rl.logprobs import token_logprobs
from morse_jax.rl.run import record
from morse_jax.rl.state import TrainState
from morse_jax.rl.train_step import StepConfig, init_opt_states
from tests.rl.test_vl_update import LORA, rows_of


def state_of(experts, step=3):
  return TrainState(step=jnp.int32(step), experts=experts, router=None,
                    opt_states=init_opt_states(experts, None, StepConfig()),
                    rng=jax.random.key(4), cursor=jnp.int32(5))


def test_vl_experts_round_trip_and_score_image_rows_alike(vl_folder, tmp_path):
  model = vl.load(vl_folder[0])
  experts = lora.init_experts(LORA, model.config.text, jax.random.key(1))
  experts = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape),
                         experts)
  meta = record(model=model.config, lora=LORA, step=StepConfig())
  assert meta["model"]["vision"]["depth"] == 3 and meta["model"]["text"]["mrope_section"]
  with Checkpoints(str(tmp_path / "ckpt"), every=1, keep=2, metadata=meta) as ckpt:
    assert ckpt.maybe_save(state_of(experts), force=True)
  template = state_of(jax.tree.map(jnp.zeros_like, experts), step=0)
  with Checkpoints(str(tmp_path / "ckpt"), every=1, keep=2, metadata=meta) as ckpt:
    restored = ckpt.restore(template)
  assert int(restored.step) == 3 and int(restored.cursor) == 5
  for a, b in zip(jax.tree.leaves(restored.experts), jax.tree.leaves(experts)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  batch, images = rows_of(model, True)
  batch = vl_inputs.with_images(batch, model, images)

  def logp(e):
    adapter = adapter_of(e, batch.routes, LORA, model.config.text, "gather")
    return token_logprobs(model.params.text, model.config.text, adapter, batch.tokens,
                          batch.attention_mask, images=batch.images)[0]
  np.testing.assert_array_equal(np.asarray(logp(restored.experts)), np.asarray(logp(experts)))

  # the same experts' shapes recorded for a text backbone (no vision tower): refused
  text_meta = record(model=model.config.text, lora=LORA, step=StepConfig())
  with Checkpoints(str(tmp_path / "ckpt"), every=1, keep=2, metadata=text_meta) as ckpt:
    with pytest.raises(CheckpointError, match="model"):
      ckpt.restore(template)
