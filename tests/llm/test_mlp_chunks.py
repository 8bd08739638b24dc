"""A long pass's MLP a chunk of tokens at a time: the same values and gradients as one product."""

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import llm
from morse_jax.llm import model as model_lib

CONFIG = llm.LlmConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=48, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=8)


def test_chunked_mlp_equals_one_product(monkeypatch):
  params = llm.init_random(CONFIG, jax.random.key(0))
  lp = jax.tree.map(lambda a: a[0], params.layers)
  h = jax.random.normal(jax.random.key(1), (2, 32, 16))

  def run(h, lp):
    return model_lib.mlp(h, lp, None, None, model_lib.STORED)

  one = run(h, lp)
  one_grad = jax.grad(lambda h, lp: jnp.sum(run(h, lp) ** 2), (0, 1))(h, lp)
  monkeypatch.setattr(model_lib, "MLP_CHUNK", 8)  # 32 tokens: 4 chunks
  jaxpr = str(jax.make_jaxpr(run)(h, lp))
  assert "checkpoint" in jaxpr or "remat" in jaxpr  # the chunked path ran: the test can fail
  np.testing.assert_allclose(run(h, lp), one, atol=1e-6)
  chunked_grad = jax.grad(lambda h, lp: jnp.sum(run(h, lp) ** 2), (0, 1))(h, lp)
  for a, b in zip(jax.tree.leaves(chunked_grad), jax.tree.leaves(one_grad)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  monkeypatch.setattr(model_lib, "MLP_CHUNK", 12)  # not a divisor of 32: one product
  assert "checkpoint" not in str(jax.make_jaxpr(run)(h, lp))
