"""Prototype router: Plackett-Luce probabilities, sampling, gradients, merge nodes, embedders."""

import itertools

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from morse_jax import llm
from morse_jax.lora import embedders, router

CONFIG = router.RouterConfig(dim=8, top_k=2, temperature=0.5)
# compiled once per shape: the distinct form runs a few dozen small ops
route_log_prob = jax.jit(router.route_log_prob,
                         static_argnames=("mode", "routes_per_node", "max_resample"))


@pytest.fixture(scope="module")
def params():
  return router.init_router(CONFIG, input_dim=12, num_subtask_experts=4, key=jax.random.key(0))


@pytest.mark.slow
def test_plackett_luce_probabilities_of_all_ordered_subsets_sum_to_one(params):
  emb = jax.random.normal(jax.random.key(1), (3, 12))
  logp = router.log_probs(params, emb, CONFIG)
  for k in (1, 2, 3, 4):
    routes = jnp.asarray(list(itertools.permutations(range(4), k)))  # every ordered k-subset
    total = 0.0
    for route in routes:
      total = total + jnp.exp(router.route_log_prob(logp, jnp.tile(route, (3, 1))))
    np.testing.assert_allclose(total, 1.0, atol=1e-5)


def test_plackett_luce_by_hand():
  logp = jnp.log(jnp.asarray([[0.5, 0.3, 0.2]]))
  route = jnp.asarray([[1, 0]])
  # 0.3 * 0.5 / (1 - 0.3)
  np.testing.assert_allclose(jnp.exp(router.route_log_prob(logp, route)), 0.3 * 0.5 / 0.7,
                             rtol=1e-6)
  np.testing.assert_allclose(jnp.exp(router.route_log_prob(logp, route, "sum_log_p")), 0.15,
                             rtol=1e-6)


def test_distinct_route_probabilities_by_hand():
  """pi = (0.5, 0.3, 0.2), K 2, R = max_resample 1. Node 0 draws (0, 1) then (2, 0); node 1
  draws (0, 1) then (1, 0), a repeat of the set {0, 1}, kept only at the last try.
    PL(0,1) = 0.5 * 0.3 / 0.5 = 0.3      PL(1,0) = 0.3 * 0.5 / 0.7 = 0.2142857
    PL(2,0) = 0.2 * 0.5 / 0.8 = 0.125    q = mass of {0, 1} = 0.3 + 0.2142857 = 0.5142857
    first routes: q = 0, P = PL
    (2,0) after {0,1}: PL * (1 - q^2) / (1 - q) = 0.125 * 1.5142857 = 0.1892857
    (1,0) after {0,1}: PL * q^1 = 0.2142857 * 0.5142857 = 0.1102041"""
  logp = jnp.log(jnp.tile(jnp.asarray([[0.5, 0.3, 0.2]]), (4, 1)))
  routes = jnp.asarray([[0, 1], [2, 0], [0, 1], [1, 0]])
  got = jnp.exp(route_log_prob(logp, routes, "distinct_plackett_luce", routes_per_node=2,
                                      max_resample=1))
  np.testing.assert_allclose(got, [0.3, 0.1892857, 0.3, 0.1102041], rtol=1e-5)
  # no redraw (R = 0): the plain Plackett-Luce probabilities
  plain = route_log_prob(logp, routes, "distinct_plackett_luce", routes_per_node=2,
                                max_resample=0)
  np.testing.assert_allclose(plain, route_log_prob(logp, routes), rtol=1e-6)
  with pytest.raises(ValueError, match="needs routes_per_node"):
    router.route_log_prob(logp, routes, "distinct_plackett_luce")


@pytest.mark.parametrize("resample", [1, 3])
def test_distinct_route_probabilities_sum_to_one_given_the_earlier_routes(params, resample):
  """For each earlier pair of routes, the probabilities of every ordered third route sum to 1
  (K 2 of 4 experts, B 3)."""
  emb = jnp.tile(jax.random.normal(jax.random.key(5), (1, 12)), (3, 1))
  logp = router.log_probs(params, emb, CONFIG)
  ordered = list(itertools.permutations(range(4), 2))
  for first, second in [((0, 1), (2, 3)), ((0, 1), (1, 0)), ((3, 2), (0, 2))]:
    routes = jnp.asarray([[first, second, third] for third in ordered])  # [12, B, K]
    flat = routes.reshape(-1, 2)
    got = route_log_prob(jnp.tile(logp, (len(ordered), 1)), flat,
                                "distinct_plackett_luce", routes_per_node=3,
                                max_resample=resample).reshape(len(ordered), 3)
    np.testing.assert_allclose(jnp.exp(got[:, 2]).sum(), 1.0, atol=1e-5)


@pytest.mark.slow  # 600 host-loop draws
def test_distinct_routes_draws_follow_the_distinct_probabilities():
  """distinct_routes' second route, drawn 600 times after its first: frequencies within
  0.06 of the distinct Plackett-Luce probabilities."""
  logp = jnp.log(jnp.asarray([0.5, 0.3, 0.2]))
  counts = {}
  for i in range(600):
    routes = router.distinct_routes(jax.random.key(i), logp, 2, 2, max_resample=1)
    if tuple(routes[0]) == (0, 1):
      counts[tuple(routes[1])] = counts.get(tuple(routes[1]), 0) + 1
  total = sum(counts.values())
  for second, c in counts.items():
    pair = jnp.asarray([[0, 1], list(second)])
    expected = float(jnp.exp(route_log_prob(
        jnp.tile(logp[None], (2, 1)), pair, "distinct_plackett_luce", routes_per_node=2,
        max_resample=1))[1])
    assert abs(c / total - expected) < 0.06, (second, c / total, expected)


def test_gumbel_top_k_draws_follow_plackett_luce():
  logp = jnp.log(jnp.asarray([[0.5, 0.3, 0.2]]))
  routes = router.sample_routes(jax.random.key(2), jnp.tile(logp, (20000, 1)), 2)
  counts = {}
  for r in map(tuple, np.asarray(routes)):
    counts[r] = counts.get(r, 0) + 1
  for r, c in counts.items():
    expected = float(jnp.exp(router.route_log_prob(logp, jnp.asarray([r])))[0])
    assert abs(c / 20000 - expected) < 0.012, (r, c / 20000, expected)
  assert len(counts) == 6
  assert router.greedy_routes(logp, 2).tolist() == [[0, 1]]


@pytest.mark.slow
def test_router_gradients_match_finite_differences():
  with jax.enable_x64(True):
    p = router.init_router(CONFIG, 12, 4, jax.random.key(3))
    p = jax.tree.map(lambda a: a.astype(jnp.float64), p)
    emb = jax.random.normal(jax.random.key(4), (5, 12), jnp.float64)
    routes = jnp.asarray([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]])
    adv = jnp.asarray([1.0, -0.5, 0.3, 0.0, -0.8], jnp.float64)

    def loss(p):  # the cross-route router loss plus the regularisers
      logp = router.log_probs(p, emb, CONFIG)
      reg = sum(router.regularisers(p, logp, CONFIG).values())
      return -jnp.sum(adv * router.route_log_prob(logp, routes)) + reg

    grad = jax.grad(loss)(p)
    flat, unravel = jax.flatten_util.ravel_pytree(p)
    g_flat, _ = jax.flatten_util.ravel_pytree(grad)
    eps = 1e-6
    for i in np.random.RandomState(0).choice(flat.size, 25, replace=False):
      step = jnp.zeros_like(flat).at[i].set(eps)
      fd = (loss(unravel(flat + step)) - loss(unravel(flat - step))) / (2 * eps)
      np.testing.assert_allclose(g_flat[i], fd, rtol=1e-5, atol=1e-8)


def test_regularisers_by_hand():
  p = router.RouterParams(proj=jnp.zeros((2, 2)), prototypes=jnp.asarray([[1.0, 0.0], [1.0, 1.0]]))
  cfg = router.RouterConfig(dim=2, top_k=1, proto_l2=1.0, orthogonality=1.0, diversity=1.0)
  logp = jnp.log(jnp.asarray([[0.75, 0.25], [0.25, 0.75]]))  # mean usage uniform: KL 0
  reg = router.regularisers(p, logp, cfg)
  np.testing.assert_allclose(reg["proto_l2"], 3.0)
  np.testing.assert_allclose(reg["orthogonality"], 2 * 0.5, rtol=1e-5)  # off-diagonal (1/sqrt2)^2
  np.testing.assert_allclose(reg["diversity"], 0.0, atol=1e-6)
  off = router.regularisers(p, logp, router.RouterConfig(dim=2, top_k=1, proto_l2=0.0))
  assert float(off["proto_l2"]) == 0.0


@pytest.mark.slow
def test_padding_rows_with_zero_embeddings_give_finite_gradients():
  """Regression: the update pads nodes with zero embeddings (mask 0); the gradient of a plain
  norm at 0 is NaN, and NaN * mask 0 is still NaN, which made the router NaN after one step."""
  p = router.init_router(CONFIG, 12, 4, jax.random.key(3))
  emb = jnp.concatenate([jax.random.normal(jax.random.key(4), (2, 12)), jnp.zeros((2, 12))])
  routes = jnp.asarray([[0, 1], [2, 3], [0, 1], [0, 1]])
  mask = jnp.asarray([1.0, 1.0, 0.0, 0.0])
  cfg = router.RouterConfig(dim=CONFIG.dim, top_k=2, diversity=0.1, orthogonality=0.1)

  def loss(p, emb):
    logp = router.log_probs(p, emb, cfg)
    reg = sum(router.regularisers(p, logp, cfg, mask).values())
    return -jnp.sum(mask * jnp.asarray([1.0, -1.0, 0.0, 0.0])
                    * router.route_log_prob(logp, routes)) + reg

  grads = jax.grad(loss)(p, emb)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  # Masked padding rows leave the usage regulariser as it is without them.
  regs_pad = router.regularisers(p, router.log_probs(p, emb, cfg), cfg, mask)
  regs_cut = router.regularisers(p, router.log_probs(p, emb[:2], cfg), cfg)
  np.testing.assert_allclose(regs_pad["diversity"], regs_cut["diversity"], rtol=1e-6)


def test_distinct_routes_and_merge_nodes():
  logp = jnp.log(jnp.asarray([0.4, 0.3, 0.2, 0.1]))
  routes = router.distinct_routes(jax.random.key(5), logp, num_routes=5, k=2, max_resample=50)
  assert len({frozenset(r.tolist()) for r in routes}) == 5
  # Only one set of size 4 exists: later routes repeat it after the resample limit.
  routes = router.distinct_routes(jax.random.key(6), logp, num_routes=3, k=4, max_resample=2)
  assert routes.shape == (3, 4)
  rng = np.random.default_rng(0)
  assert router.merge_node_experts([[3, 1], [1, 0]], "union", 2, rng) == [0, 1, 3]
  subset = router.merge_node_experts([[3, 1], [1, 0]], "random_subset", 2, rng)
  assert len(subset) == 2 and set(subset) <= {0, 1, 3}
  with pytest.raises(ValueError, match="top_k=5 exceeds num_subtask_experts=4"):
    router.init_router(router.RouterConfig(top_k=5), 8, 4, jax.random.key(0))
  with pytest.raises(ValueError, match="log_prob 'exact'"):
    router.RouterConfig(log_prob="exact")


def test_backbone_mean_embedder_caches_and_truncates(hf_folders):
  model = llm.load(hf_folders["llama"][0])
  emb = embedders.BackboneMeanEmbedder(model.params.embed, model.tokenizer, max_tokens=3)
  text = router.subtask_text("w1 w2", "w3 w4 w5 " * 60)
  assert len(text) == len("w1 w2: ") + 120
  out = emb([text, text, "w9"])
  ids = model.tokenizer.encode(text)[:3]
  np.testing.assert_allclose(out[0], np.asarray(model.params.embed)[ids].mean(0), rtol=1e-6)
  assert emb.misses == 2 and out.shape == (3, model.config.hidden_size)
  emb([text])
  assert emb.misses == 2  # cached


def test_sentence_embedder_runs_offline():
  emb = embedders.SentenceEmbedder()
  out = emb(["sort a list of integers", "sort a list of integers", "parse a date"])
  assert out.shape == (3, 384) and emb.misses == 2
  np.testing.assert_allclose(out[0], out[1])
  with pytest.raises(FileNotFoundError, match="no/such/folder"):
    embedders.SentenceEmbedder("/no/such/folder")
