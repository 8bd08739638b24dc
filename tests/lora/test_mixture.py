"""Mixture kernels against a per-expert loop, inside the model, against peft, and exported."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from morse_jax import llm, lora
from morse_jax.lora import export, mixture
from tests import tiny_models

ROUTE_SETS = [[0, 2, 3], [1, 4, 5], [0, 2, 3], [0, 5]]  # shared and distinct, one shorter


def random_experts(key, num_experts=6, d=16, r=4, o=12, scale=0.3):
  ka, kb = jax.random.split(key)
  return (scale * jax.random.normal(ka, (num_experts, d, r)),
          scale * jax.random.normal(kb, (num_experts, r, o)))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["dense", "gather", "grouped"])
def test_kernels_equal_the_loop_forward_and_gradients(kernel):
  kx, kw, ke = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (4, 5, 16))
  w = 0.3 * jax.random.normal(kw, (12, 16))
  a, b = random_experts(ke)
  routes = mixture.uniform_routes(ROUTE_SETS, width=3)

  def ours(a, b):
    return mixture.adapted_linear(x, w, None, a, b, routes, 2.0, kernel)

  def loop(a, b):
    return jnp.einsum("btd,od->bto", x, w) + mixture.reference_delta(x, a, b, routes, 2.0)

  np.testing.assert_allclose(ours(a, b), loop(a, b), atol=1e-5)
  probe = jax.random.normal(jax.random.key(1), (4, 5, 12))
  grads = jax.grad(lambda a, b: jnp.sum(ours(a, b) * probe), argnums=(0, 1))(a, b)
  ref = jax.grad(lambda a, b: jnp.sum(loop(a, b) * probe), argnums=(0, 1))(a, b)
  for g, g_ref in zip(grads, ref):
    np.testing.assert_allclose(g, g_ref, atol=1e-5)
  # Expert 1 is used by row 1 only: its gradient is non-zero; an unused expert gets none.
  assert float(jnp.abs(grads[0][1]).sum()) > 0
  unused = mixture.uniform_routes([[0, 2]] * 4)
  g_unused = jax.grad(lambda a: jnp.sum(mixture.adapted_linear(
      x, w, None, a, b, unused, 2.0, kernel)))(a)
  assert float(jnp.abs(g_unused[1]).sum()) == 0


def test_merged_kernel_equals_loop_for_a_shared_route():
  kx, kw, ke = jax.random.split(jax.random.key(2), 3)
  x = jax.random.normal(kx, (3, 7, 16))
  w = 0.3 * jax.random.normal(kw, (12, 16))
  a, b = random_experts(ke)
  routes = mixture.uniform_routes([[1, 3, 4]] * 3)
  ref = jnp.einsum("btd,od->bto", x, w) + mixture.reference_delta(x, a, b, routes, 2.0)
  np.testing.assert_allclose(mixture.adapted_linear(x, w, None, a, b, routes, 2.0, "merged"),
                             ref, atol=1e-5)
  ga = jax.grad(lambda a: jnp.sum(mixture.adapted_linear(x, w, None, a, b, routes, 2.0,
                                                         "merged") ** 2))(a)
  gr = jax.grad(lambda a: jnp.sum((jnp.einsum("btd,od->bto", x, w) + mixture.reference_delta(
      x, a, b, routes, 2.0)) ** 2))(a)
  np.testing.assert_allclose(ga, gr, atol=1e-4, rtol=1e-5)


LORA = lora.LoraConfig(targets=("q", "v", "o"), last_n_layers=1, rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def llama(hf_folders):
  folder, torch_model = hf_folders["llama"]
  model = llm.load(folder)
  experts = lora.init_experts(LORA, model.config, jax.random.key(3))
  # B = 0 at init would hide every mistake: give B random values too.
  keys = iter(jax.random.split(jax.random.key(4), 8))
  experts = {t: lora.ExpertWeights(a=e.a * 10, b=0.2 * jax.random.normal(next(keys), e.b.shape))
             for t, e in experts.items()}
  return model, torch_model, experts


def adapter_for(experts, model, routes, kernel="dense"):
  return mixture.Adapter(experts=experts, routes=routes,
                         layers=LORA.adapted_layers(model.config), scale=LORA.scale, kernel=kernel)


@pytest.mark.slow
def test_kernels_agree_inside_the_model_prefill_and_decode(llama):
  model, _, experts = llama
  tokens = jnp.asarray(tiny_models.random_tokens(0, (4, 9)))
  routes = mixture.uniform_routes(ROUTE_SETS, width=3)
  dense, _ = llm.forward(model.params, model.config, tokens,
                         adapter=adapter_for(experts, model, routes))
  bare, _ = llm.forward(model.params, model.config, tokens)
  assert float(jnp.abs(dense - bare).max()) > 1e-2  # the experts change the output
  for kernel in ("gather", "grouped"):
    out, _ = llm.forward(model.params, model.config, tokens,
                         adapter=adapter_for(experts, model, routes, kernel))
    np.testing.assert_allclose(out, dense, atol=1e-4)
  # Cached decode with experts equals the full pass (the scan, and the CPU decode loop's fused
  # [in, out] layers).
  adapter = adapter_for(experts, model, routes, "gather")
  for fused in (False, True):
    np.testing.assert_allclose(
        prefill_then_decode(model.params, model.config, tokens, 6, adapter, fused), dense,
        atol=1e-4)


def prefill_then_decode(params, config, tokens, prefix: int, adapter, fused: bool = False):
  """Logits of every position: the first `prefix` tokens in one cached pass, then one by one
  (fused: in `llm.fused_decode`'s layout, as the CPU decode loop)."""
  cache = llm.init_cache(config, tokens.shape[0], tokens.shape[1] + 1)
  first, cache = llm.forward(params, config, tokens[:, :prefix], cache=cache, adapter=adapter)
  run_layers = None
  if fused:
    params, cache = llm.fused_decode.decode_layout(params, cache)
    run_layers = llm.fused_decode.run_layers
  steps = [first]
  for i in range(prefix, tokens.shape[1]):
    logits, cache = llm.forward(params, config, tokens[:, i:i + 1], cache=cache, adapter=adapter,
                                run_layers=run_layers)
    steps.append(logits)
  return jnp.concatenate(steps, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["dense", "merged"])
def test_fused_decode_layers_with_every_target_and_biases(hf_folders, kernel):
  """qwen2 (q/k/v biases) with experts on all seven projections: the fused layers' one q/k/v
  and one gate/up matmul plus each target's delta equal the stored layout, prefill and decode."""
  folder, _ = hf_folders["qwen2"]
  model = llm.load(folder)
  every = lora.LoraConfig(targets=tuple(lora.TARGETS), last_n_layers=2, rank=4, alpha=8.0)
  experts = jax.tree.map(lambda x: x + 0.05, lora.init_experts(every, model.config,
                                                                jax.random.key(4)))
  sets = ROUTE_SETS if kernel == "dense" else [ROUTE_SETS[0]] * len(ROUTE_SETS)
  adapter = lora.make_adapter(experts, every, model.config, sets, kernel=kernel)
  tokens = jnp.asarray(tiny_models.random_tokens(2, (4, 7)))
  want, _ = llm.forward(model.params, model.config, tokens, adapter=adapter)
  assert float(jnp.abs(want - llm.forward(model.params, model.config, tokens)[0]).max()) > 1e-2
  np.testing.assert_allclose(
      prefill_then_decode(model.params, model.config, tokens, 5, adapter, fused=True), want,
      atol=1e-4)


def test_merged_kernel_and_merged_weights_match(llama, tmp_path):
  model, _, experts = llama
  tokens = jnp.asarray(tiny_models.random_tokens(1, (2, 8)))
  route = [0, 3, 4]
  routes = mixture.uniform_routes([route] * 2)
  merged_kernel, _ = llm.forward(model.params, model.config, tokens,
                                 adapter=adapter_for(experts, model, routes, "merged"))
  folded = export.merge_route(model.params, experts, LORA, model.config, route)
  plain, _ = llm.forward(folded, model.config, tokens)
  dense, _ = llm.forward(model.params, model.config, tokens,
                         adapter=adapter_for(experts, model, routes))
  np.testing.assert_allclose(merged_kernel, dense, atol=1e-4)
  np.testing.assert_allclose(plain, dense, atol=1e-4)
  # The merged weights as a Hugging Face folder: transformers reads the same logits back.
  from transformers import AutoModelForCausalLM

  llm.save(llm.Model(config=model.config, params=folded, hf_config=model.hf_config), str(tmp_path))
  reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = reloaded(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(theirs, plain, atol=1e-4)


def peft_logits(torch_model, adapter_dir, tokens):
  import copy

  from peft import PeftModel

  peft_model = PeftModel.from_pretrained(copy.deepcopy(torch_model), adapter_dir).eval()
  with torch.no_grad():
    return peft_model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


def test_one_expert_equals_peft_lora(llama, tmp_path):
  model, torch_model, experts = llama
  tokens = jnp.asarray(tiny_models.random_tokens(2, (2, 10)))
  expert = 4
  export.export_peft(experts, LORA, model.config, [expert], str(tmp_path))
  ours, _ = llm.forward(model.params, model.config, tokens,
                        adapter=adapter_for(experts, model, mixture.uniform_routes([[expert]] * 2)))
  np.testing.assert_allclose(peft_logits(torch_model, str(tmp_path), tokens), ours, atol=1e-4)


def test_exported_route_loaded_by_peft_gives_our_mixture(llama, tmp_path):
  model, torch_model, experts = llama
  tokens = jnp.asarray(tiny_models.random_tokens(3, (2, 10)))
  route = [1, 2, 5]
  export.export_peft(experts, LORA, model.config, route, str(tmp_path))
  ours, _ = llm.forward(model.params, model.config, tokens,
                        adapter=adapter_for(experts, model, mixture.uniform_routes([route] * 2),
                                            "gather"))
  np.testing.assert_allclose(peft_logits(torch_model, str(tmp_path), tokens), ours, atol=1e-4)


def test_trainable_fraction_reproduces_the_paper_on_qwen3_4b_shapes():
  qwen3_4b = llm.LlmConfig("qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                           num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                           qk_norm=True, tie_word_embeddings=True)
  assert abs(qwen3_4b.num_params() - 4.022e9) < 0.01e9
  fraction = lora.trainable_fraction(lora.LoraConfig(), qwen3_4b)
  assert abs(100 * fraction - 0.170) < 0.005, 100 * fraction


def test_bad_settings_are_named():
  small = llm.LlmConfig("llama", 10, 8, 16, 4, 2, 1, 4)
  with pytest.raises(lora.LoraConfigError, match="unknown target"):
    lora.LoraConfig(targets=("q", "qkv"))
  with pytest.raises(lora.LoraConfigError, match="rank must be a positive integer, got 0"):
    lora.LoraConfig(rank=0)
  with pytest.raises(lora.LoraConfigError, match="no experts"):
    lora.LoraConfig(roles=(), num_subtask_experts=0)
  with pytest.raises(lora.LoraConfigError, match="index 7 is out of range .* 4 layers"):
    lora.LoraConfig(layers=(1, 7)).adapted_layers(small)
  with pytest.raises(lora.LoraConfigError, match="subtask expert 4 does not exist"):
    lora.LoraConfig().subtask_index(4)
  with pytest.raises(ValueError, match="expert 9, which does not exist"):
    export.route_as_lora({}, lora.LoraConfig(), [0, 9])
  with pytest.raises(ValueError, match="unknown mixture kernel 'fast'"):
    mixture.Adapter(experts={}, routes=None, layers=(), scale=1.0, kernel="fast")


@pytest.mark.slow
def test_sampler_runs_each_row_with_its_own_route(llama):
  """Rows sampled together with different routes equal each route sampled alone."""
  model, _, experts = llama
  prompts = [tiny_models.random_tokens(10 + i, (4 + i,)).tolist() for i in range(3)]
  sets = [[0, 2, 3], [1, 4, 5], [0, 5]]
  kwargs = dict(settings=llm.GenerationSettings(8, llm.GREEDY), rng=jax.random.key(0))
  together = llm.sample(model, prompts, **kwargs,
                        adapter=adapter_for(experts, model, mixture.uniform_routes(sets, 3), "gather"))
  bare = llm.sample(model, prompts, **kwargs)
  assert not np.array_equal(together.tokens, bare.tokens)
  for row in range(3):
    alone = llm.sample(model, prompts[row:row + 1], **kwargs,
                       adapter=adapter_for(experts, model, mixture.uniform_routes([sets[row]], 3),
                                           "gather"))
    np.testing.assert_array_equal(together.tokens[row], alone.tokens[0])


@pytest.mark.slow
def test_expert_gradients_through_the_model_agree_across_kernels(llama):
  """Training forward/backward through the scanned stack: every kernel, the same gradients."""
  model, _, experts = llama
  tokens = jnp.asarray(tiny_models.random_tokens(5, (4, 6)))
  routes = mixture.uniform_routes(ROUTE_SETS, width=3)

  def loss(experts, kernel):
    logits, _ = llm.forward(model.params, model.config, tokens,
                            adapter=adapter_for(experts, model, routes, kernel))
    return jnp.mean(jax.nn.log_softmax(logits)[..., 7])

  ref = jax.grad(loss)(experts, "dense")
  assert float(jnp.abs(ref["q"].a).sum()) > 0 and float(jnp.abs(ref["o"].b).sum()) > 0
  for kernel in ("gather", "grouped"):
    got = jax.grad(loss)(experts, kernel)
    for t in experts:
      np.testing.assert_allclose(got[t].a, ref[t].a, atol=1e-5)
      np.testing.assert_allclose(got[t].b, ref[t].b, atol=1e-5)


def test_make_adapter_validates_and_picks_kernels(llama):
  model, _, experts = llama
  shared = lora.make_adapter(experts, LORA, model.config, [[0, 2]] * 3)
  assert shared.kernel == "merged"
  mixed = lora.make_adapter(experts, LORA, model.config, [[0, 2], [1, 3, 5]])
  assert mixed.kernel == "auto" and mixed.routes.idx.shape == (2, 3)
  tokens = jnp.asarray(tiny_models.random_tokens(6, (2, 5)))
  auto, _ = llm.forward(model.params, model.config, tokens, adapter=mixed)
  dense, _ = llm.forward(model.params, model.config, tokens,
                         adapter=lora.make_adapter(experts, LORA, model.config,
                                                   [[0, 2], [1, 3, 5]], kernel="dense"))
  np.testing.assert_allclose(auto, dense, atol=1e-5)
  assert mixture.pick_kernel(512, 16, 3, backend="gpu") == "grouped"
  assert mixture.pick_kernel(512, 6, 3, backend="cpu") == "dense"
  assert mixture.pick_kernel(512, 16, 3, backend="cpu") == "gather"
  with pytest.raises(lora.LoraConfigError, match="row 1 names expert 6, which does not exist"):
    lora.make_adapter(experts, LORA, model.config, [[0], [1, 6]])
  with pytest.raises(lora.LoraConfigError, match="repeats an expert"):
    lora.make_adapter(experts, LORA, model.config, [[2, 2]])
