"""What `launchers.generate` runs, apart from its flags so that tests import it beside other
launchers (absl flags are process-wide): its default tiny random model and the sampler it picks
(the engine on one device, `llm.sample` over a larger mesh)."""

from __future__ import annotations


def tiny_random_model():
  import jax

  from morse_jax import llm

  config = llm.LlmConfig("llama", vocab_size=512, hidden_size=64, intermediate_size=192,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
  params = llm.init_random(config, jax.random.key(0), scale=0.3, norm_jitter=0.1)
  return llm.Model(config=config, params=params)


def sampler(model, rows, settings, mesh):
  """rng -> SampleOutput for `rows`: the engine on one device (row i draws with fold_in(rng, i),
  as `llm.sample`), `llm.sample` over a larger mesh."""
  from morse_jax import llm
  from morse_jax.llm.engine import Engine, EngineConfig

  if mesh.size > 1:
    return lambda rng: llm.sample(model, rows, settings, rng=rng, mesh=mesh)
  page = 16
  longest = max(map(len, rows)) + settings.max_new_tokens
  config = EngineConfig(slots=len(rows), max_len=min(-(-longest // page) * page,
                                                     model.config.max_position_embeddings),
                        page_size=page)
  engine = Engine(model, config)  # one pool and compiled programs for both calls
  return lambda rng: engine.generate(rows, settings, rng=rng)
