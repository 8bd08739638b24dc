"""The paper's Proposition 3.1 on a synthetic two-level bandit.

Each of B routes has its own expert policy p_b = softmax(theta_b) over V actions; a reward is
route offset + action value + noise. With baseline-subtracted rewards, the expert gradient
  g = 1/(BM) sum_bm A_bm grad log p_b(y_bm)
has (about) the same mean under GRPO's global baseline and HGRPO's per-route baseline, and the
variance drops by about sigma_C^2 E||grad log p||^2 / (BM), sigma_C^2 the spread of the true
route means. (Sample-mean baselines shrink the means by 1 - 1/(BM) and 1 - 1/M: corrected below.)
"""

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import rl

B, M, V, TRIALS = 4, 16, 5, 6000
OFFSETS = jnp.asarray([0.0, 1.0, 2.0, 3.5])
VALUES = jnp.asarray([0.0, 0.5, 1.0, -0.5, 0.2])
NOISE = 0.3


def test_hgrpo_keeps_the_mean_and_cuts_the_variance():
  theta = jax.random.normal(jax.random.key(0), (B, V))
  probs = jax.nn.softmax(theta, axis=-1)  # [B, V]

  def one_trial(key):
    ka, kn = jax.random.split(key)
    actions = jax.vmap(lambda k, lg: jax.random.categorical(k, lg, shape=(M,)))(
        jax.random.split(ka, B), theta)  # [B, M]
    u = OFFSETS[:, None] + VALUES[actions] + NOISE * jax.random.normal(kn, (B, M))
    score = jax.nn.one_hot(actions, V) - probs[:, None, :]  # grad_theta_b log p_b(y): [B, M, V]
    grad = lambda adv: jnp.einsum("bm,bmv->bv", adv, score) / (B * M)
    return (grad(rl.grpo(u, clip=None, normalize=False)),
            grad(rl.hgrpo(u, clip=None, normalize=False).within))

  g_grpo, g_hgrpo = jax.vmap(one_trial)(jax.random.split(jax.random.key(1), TRIALS))
  mean_grpo = g_grpo.mean(0) / (1 - 1 / (B * M))
  mean_hgrpo = g_hgrpo.mean(0) / (1 - 1 / M)
  exact = jnp.einsum("bv,bv->bv", probs, VALUES[None] - (probs * VALUES).sum(-1, keepdims=True))
  exact = exact / B  # E[u grad log p] per route block, averaged over the B routes
  np.testing.assert_allclose(mean_hgrpo, exact, atol=3e-3)
  np.testing.assert_allclose(mean_grpo, exact, atol=6e-3)

  var = lambda g: float(jnp.sum(g.var(0)))
  route_means = OFFSETS + probs @ VALUES
  sigma_c2 = float(route_means.var())
  score_norm2 = float(jnp.mean(1 - jnp.sum(probs ** 2, -1)))  # E||onehot - p||^2
  predicted = sigma_c2 * score_norm2 / (B * M)
  measured = var(g_grpo) - var(g_hgrpo)
  assert var(g_hgrpo) < var(g_grpo)
  print(f"variance drop measured {measured:.3e}, predicted {predicted:.3e}")
  assert abs(measured - predicted) < 0.2 * predicted, (measured, predicted)
