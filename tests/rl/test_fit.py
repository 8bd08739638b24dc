"""The analytical memory model of `rl.aot` (the blocked attention's term by hand, against a
compiled update) and the paper runs' presets fitting their chips by it (`launchers.fit`)."""

import jax
import jax.numpy as jnp
import pytest

from configs.apex import paper
from configs.morse import scicode
from launchers import fit_plan as fit
from morse_jax.llm import sharding
from morse_jax.llm.config import LlmConfig
from morse_jax.llm.presets import ARCHITECTURES
from morse_jax.lora.experts import LoraConfig
from morse_jax.rl import aot
from morse_jax.rl.train_step import StepConfig

GIB = 2 ** 30
PAPER_BACKBONES = ("qwen3_4b", "llama31_8b")  # MoRSE's (docs/RESULTS.md, "Does a paper run fit?")
H100, V5E = 79.6 * GIB, 16 * GIB
TINY = LlmConfig("qwen3", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                 max_position_embeddings=1 << 16)
TINY_LORA = LoraConfig(last_n_layers=1)


def tiny_update(tokens: int, *, remat: bool = True):
  """(RunShapes, args, kwargs) of a float32 update of 2 rows x `tokens` on one device."""
  shapes = aot.RunShapes(nodes=1, routes_per_node=1, group_size=2, prompt_tokens=tokens // 2,
                         max_new_tokens=tokens // 2, share_prompts=False, route_width=1,
                         embed_dim=TINY.hidden_size)
  step = StepConfig(estimator="grpo", remat=remat)
  args, kwargs = aot.update_args(TINY, TINY_LORA, None, step, shapes, aot.abstract_mesh(1, 1),
                                 dtype=jnp.float32)
  return shapes, args, kwargs


def test_attention_term_by_hand():
  # 2 rows x 8192 tokens, 4 heads x 16 (q 64), 2 kv heads x 16 (kv 32), blocks 256 x 256:
  # f32 dq and output gradient (2 x 64 per token), dk and dv (2 x 32), 3 blocks of scores
  shapes, args, _ = tiny_update(8192)
  assert (shapes.rows, shapes.width) == (2, 8192)
  by_hand = 2 * (4 * (8192 * 2 * 64 + 8192 * 2 * 32) + 3 * 4 * 4 * 256 * 256)
  estimate = aot.update_estimate(TINY, shapes, aot.abstract_mesh(1, 1), args, remat=True)
  assert estimate["attention"] == by_hand == 18_874_368
  # linear in tokens: the dense attention's scores and probabilities were 2 x 4 x 2 x 4 x t^2
  # (4 GiB here), never held now
  shapes16, args16, _ = tiny_update(16384)
  twice = aot.update_estimate(TINY, shapes16, aot.abstract_mesh(1, 1), args16, remat=True)
  blocks = 2 * 3 * 4 * 4 * 256 * 256
  assert twice["attention"] - blocks == 2 * (estimate["attention"] - blocks)
  # layers with remat: each layer's input (64 f32 per token) and one layer's saved set, whose
  # MLP (gate, up, product: 3 x 128) runs 4096 tokens at a time (model.MLP_CHUNK)
  saved = 4 * (4 * 64 + 2 * 64 + 2 * 32) + 4 * 4
  assert estimate["layers"] == 2 * (8192 * (2 * 4 * 64 + saved) + 4096 * 4 * 3 * 128)
  # logits 512 tokens at a time (four f32 chunks), the final hidden states and their gradient
  assert estimate["logits"] == 4 * 4 * 2 * 512 * 128 + (4 + 4) * 2 * 8192 * 64


def test_sampler_rows_at_full_length_by_hand():
  # Qwen3-8B on 4 x 2: 36 layers x 4 of 8 kv heads x 128, k and v in bf16, 32768 slots
  row = aot.cache_row_bytes(ARCHITECTURES["Qwen3-8B"], 32768, aot.abstract_mesh(4, 2))
  assert row == 2 * 2 * 36 * 4 * 32768 * 128 == int(2.25 * GIB)
  estimate = {"arguments": 8 * GIB, "activations": 1 * GIB, "cache_per_row": row}
  # (79.6 - 9) GiB over 2.25 GiB x (1 + 1/4) for the prefilled rows' cache beside: 25 rows
  assert aot.rows_at_full_length(estimate, H100, group_size=4) == 25


def test_compiled_tiny_update_is_near_the_analytical_bytes():
  # XLA:CPU's compiled peak of a float32 update with remat (nothing to separate as f32 copies)
  # within 25% of the analytical bytes at 8192 tokens, where the dense attention's scores
  # alone would have been 4 GiB
  shapes, args, kwargs = tiny_update(8192)
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  compiled = aot.memory(aot.train_step_fn(), args, kwargs, mesh)
  estimate = aot.update_estimate(TINY, shapes, aot.abstract_mesh(1, 1), args, remat=True)
  assert compiled["cpu_f32_copies"] == 0
  assert abs(compiled["peak"] - estimate["total"]) <= 0.25 * estimate["total"], (compiled,
                                                                                   estimate)
  assert compiled["peak"] < 256 * 2 ** 20


def _morse_plan(backbone, hardware):
  config = scicode.get_config(f"mole_hgrpo,{backbone},{hardware}")
  return fit.plan(config)


def _estimates(p):
  amesh = aot.abstract_mesh(*p.mesh)
  update_args, _ = aot.update_args(p.model, p.lora, p.router, p.step, p.shapes, amesh)
  sample_args, _ = aot.sample_args(p.model, p.lora, p.shapes, amesh)
  return (aot.update_estimate(p.model, p.shapes, amesh, update_args, remat=p.step.remat),
          aot.sample_estimate(p.model, p.shapes, amesh, sample_args))


@pytest.mark.parametrize("backbone", PAPER_BACKBONES)
@pytest.mark.parametrize("hardware,chip", (("gpu8", H100), ("tpu_v5e8", V5E)),
                         ids=("gpu8", "tpu_v5e8"))
def test_morse_presets_fit_their_chip(backbone, hardware, chip):
  # The analytical bytes of the paper-length MoRSE run (launchers.fit's shapes) on the preset:
  # a preset change that breaks the fit fails here. The whole sampler call fits too.
  update, sampler = _estimates(_morse_plan(backbone, hardware))
  assert update["total"] <= chip, (backbone, hardware, update["total"] / GIB)
  assert sampler["total"] <= chip, (backbone, hardware, sampler["total"] / GIB)


@pytest.mark.parametrize("stage", ("executor", "distiller", "planner", "ttrl"))
def test_apex_paper_stages_fit_an_h100(stage):
  # Each APEx stage's update at the paper's lengths fits an H100-80GB on the paper config's
  # mesh and micro-batches; the sampler holds at least 8 full-length rows per device beside
  # the weights (a call's other rows wait for a slot).
  p = fit.plan(paper.get_config("model=/m,judge=/j"), stage=stage)
  assert p.step.remat and p.mesh == (paper.MESH["data"], paper.MESH["model"])
  update, sampler = _estimates(p)
  assert update["total"] <= H100, (stage, update["total"] / GIB)
  assert aot.rows_at_full_length(sampler, H100, p.shapes.group_size) >= 8, stage


def test_an_unknown_apex_stage_is_refused_by_name():
  with pytest.raises(Exception, match=r"--stage='critic': not in config.stages .* nor 'ttrl'"):
    fit.plan(paper.get_config("model=/m,judge=/j"), stage="critic")


def test_apex_executor_stage_runs_on_the_vl_preset():
  """The executor stage is measured on the paper config's Qwen2.5-VL-7B executor: rows of 4
  images (the question's and 3 search results) of 256 tokens, their `ImageRows` in the update
  and the sampler, the frozen tower's weights beside each, and the tower's own pass."""
  p = fit.plan(paper.get_config("model=/m,judge=/j"), stage="executor")
  assert p.name == paper.EXECUTOR_PRESET and p.vision is not None
  assert (p.shapes.images, p.shapes.image_tokens, p.shapes.feature_slots) == (4, 256, 1024)
  assert not p.shapes.shared and p.model.mrope_section is not None
  amesh = aot.abstract_mesh(*p.mesh)
  update_args, _ = aot.update_args(p.model, p.lora, p.router, p.step, p.shapes, amesh)
  images = update_args[4].images
  assert images.features.shape == (p.shapes.rows, 1024, 3584)
  assert images.positions.shape == (p.shapes.rows, 3, p.shapes.width)
  tower_args, _ = aot.tower_args(p.vision, 1024, amesh)
  tower = aot.tower_estimate(p.vision, tower_args)
  # 16 images per pass x 1024 patches: 7 x 1280 + 3 x 3420 bf16, 16 heads x 1024 f32 + bf16
  per_patch = 2 * (7 * 1280 + 3 * 3420) + 6 * 16 * 1024
  assert tower["activations"] == 16 * 1024 * per_patch
  assert tower["features"] == 1024 * 256 * 3584 * 2
  update, sampler = _estimates(p)
  update, sampler = (aot.with_tower_weights(e, tower) for e in (update, sampler))
  assert update["tower_weights"] == tower["weights"] > GIB
  assert update["total"] <= H100 and tower["total"] <= H100
  assert aot.rows_at_full_length(sampler, H100, p.shapes.group_size) >= 8


def test_compiled_tiny_vl_update_and_tower_trace():
  """The abstract VL arguments are the ones the code takes: a tiny update with image rows and
  a tiny tower in passes compile (one device)."""
  from morse_jax.llm import vision

  shapes = aot.RunShapes(nodes=1, routes_per_node=1, group_size=2, prompt_tokens=32,
                         max_new_tokens=32, route_width=1, embed_dim=TINY.hidden_size, images=1,
                         image_tokens=4)
  mrope = LlmConfig("qwen2", vocab_size=128, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    mrope_section=(2, 3, 3))
  mesh, amesh = sharding.make_mesh(1, 1, jax.devices()[:1]), aot.abstract_mesh(1, 1)
  args, kwargs = aot.update_args(mrope, TINY_LORA, None, StepConfig(estimator="grpo"), shapes,
                                 amesh, dtype=jnp.float32)
  assert args[4].images.features.shape == (2, 4, 64)
  assert aot.memory(aot.train_step_fn(), args, kwargs, mesh)["peak"] > 0
  small = vision.VisionConfig(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                              out_hidden_size=64, window_size=112, fullatt_block_indexes=(0,))
  tower_args, _ = aot.tower_args(small, 3, amesh, jnp.float32)
  assert tower_args[3:] == ((1, 32, 32), 3, 3)
  assert aot.memory(aot.tower_fn(), tower_args, {}, mesh)["peak"] > 0
