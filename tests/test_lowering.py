"""The update step, the sampler and the mixture kernels lower for TPU and GPU on the hardware
presets' meshes at Qwen3-4B shapes, from abstract arrays (nothing is allocated), and the exported
modules declare the input shardings the code intends (morse_jax.rl.aot)."""

import re

import jax
import pytest

from configs.morse import common
from morse_jax.llm import attention
from morse_jax.llm import sharding
from morse_jax.llm import model as model_lib
from morse_jax.llm.config import LlmConfig
from morse_jax.llm.presets import ARCHITECTURES
from morse_jax.lora import mixture
from morse_jax.lora.experts import LoraConfig
from morse_jax.lora.router import RouterConfig
from morse_jax.rl import aot
from morse_jax.rl.train_step import StepConfig

QWEN3_4B = ARCHITECTURES["Qwen3-4B-Instruct-2507"]
PRESETS = ("gpu8", "tpu_v5e8")
PLATFORMS = ("tpu", "cuda")
LORA = LoraConfig()  # q, v, o in the last 8 layers, 2 roles + 4 subtask experts
ROUTER = RouterConfig()


def preset(name):
  """(abstract mesh, shapes, StepConfig) of a hardware preset: 4 nodes x B 4 x M 4, prompts of
  2048 tokens, 1024 generated."""
  data, model, micro, remat = common.HARDWARE[name]
  shapes = aot.RunShapes(nodes=4, routes_per_node=4, group_size=4, prompt_tokens=2048,
                         max_new_tokens=1024, micro_batches=micro, data=data)
  return aot.abstract_mesh(data, model), shapes, StepConfig(micro_batches=micro, remat=remat)


def donated(exported, args) -> tuple[int, int]:
  """(inputs the exported update marks as donated (aliased to an output or a buffer donor),
  flat inputs of its experts, router and optimiser state)."""
  marked = len(re.findall(r"tf\.aliasing_output|jax\.buffer_donor", exported.mlir_module()))
  return marked, len(jax.tree.leaves(args[1:4]))


def mismatches(exported, args, kwargs=None):
  """Inputs whose declared sharding differs from their abstract array's, and dropped inputs."""
  wrong, dropped = [], []
  for i, (path, x) in enumerate(aot.flat_inputs(args, kwargs)):
    got = aot.declared_axes(exported, i, len(x.shape))
    if got is None:
      dropped.append(path)
    elif got != aot.spec_axes(x):
      wrong.append((path, got, aot.spec_axes(x)))
  return wrong, dropped


def declared(exported, args, kwargs, suffix):
  """The declared axes of the one input whose path ends with `suffix`."""
  found = [(i, x) for i, (path, x) in enumerate(aot.flat_inputs(args, kwargs))
           if path.endswith(suffix)]
  assert len(found) == 1, (suffix, found)
  i, x = found[0]
  return aot.declared_axes(exported, i, len(x.shape))


def test_architectures_match_the_published_parameter_counts():
  # Hugging Face model cards: Qwen3-4B 4.0B, Qwen3-8B 8.2B, Llama-3.1-8B 8.03B, Qwen2.5-Coder-1.5B
  # 1.54B parameters.
  counts = {name: c.num_params() / 1e9 for name, c in ARCHITECTURES.items()}
  assert counts["Qwen3-4B-Instruct-2507"] == pytest.approx(4.02, abs=0.01)
  assert counts["Qwen3-8B"] == pytest.approx(8.19, abs=0.01)
  assert counts["Llama-3.1-8B-Instruct"] == pytest.approx(8.03, abs=0.01)
  assert counts["Qwen2.5-Coder-1.5B-Instruct"] == pytest.approx(1.54, abs=0.01)


def test_run_shapes_follow_the_batch_layout():
  # 4 nodes x B 4 x M 4 = 64 rows; shared layout: 16 packed rows of 2048 + 4 x 1024 -> 6144 slots
  _, gpu, _ = preset("gpu8")
  assert (gpu.rows, gpu.shared, gpu.width, gpu.packed_rows, gpu.packed_width) == (
      64, True, 1024, 16, 6144)
  assert (gpu.sample_rows, gpu.prompt_len, gpu.gen_len, gpu.num_routes) == (64, 2048, 1024, 16)
  _, tpu, _ = preset("tpu_v5e8")  # micro-batches: rows as they are, 2048 + 1024 tokens
  assert (tpu.rows, tpu.shared, tpu.width) == (64, False, 3072)
  odd = aot.RunShapes(nodes=3, routes_per_node=2, group_size=3, prompt_tokens=100,
                      max_new_tokens=50, data=4)
  # 18 rows -> 32 (a power of two); the sampler then rounds 32 up to a multiple of lcm(M, data)
  assert odd.rows == 32 and odd.sample_rows == 36


@pytest.mark.parametrize("name", PRESETS)
def test_update_step_exports_with_the_intended_shardings(name):
  mesh, shapes, step = preset(name)
  args, kwargs = aot.update_args(QWEN3_4B, LORA, ROUTER, step, shapes, mesh)
  exported = aot.export(aot.train_step_fn(), args, kwargs, platform="tpu")
  assert exported.platforms == ("tpu",) and exported.nr_devices == 8
  marked, state = donated(exported, args)  # the train state is donated
  assert state > 10 and marked == state, (marked, state)
  wrong, dropped = mismatches(exported, args, kwargs)
  assert wrong == []
  if shapes.shared:  # the forward pass reads the packed layout, not the rows' own tokens
    assert sorted(dropped) == sorted(["[0][4].tokens", "[0][4].attention_mask",
                                      "[0][4].routes.idx", "[0][4].routes.w"])
  else:
    assert dropped == []
  model = "model"
  assert declared(exported, args, kwargs, ".layers.w_gate") == ((), (model,), ())
  assert declared(exported, args, kwargs, ".layers.w_down") == ((), (), (model,))
  assert declared(exported, args, kwargs, ".embed") == ((model,), ())  # tied: the head too
  assert declared(exported, args, kwargs, "[0][1]['q'].a") == ((), (), (), ())  # replicated
  # q's B splits its output rows as wq does, and so does its Adam state
  assert declared(exported, args, kwargs, "[0][1]['q'].b") == ((), (), (), (model,))
  assert declared(exported, args, kwargs, "mu['q'].b") == ((), (), (), (model,))
  assert declared(exported, args, kwargs, "[0][4].loss_mask") == (("data",), ())
  # the eight KV heads split 2-way on tpu_v5e8; gpu8's model axis has size 1
  assert exported.in_avals[[p for p, _ in aot.flat_inputs(args, kwargs)].index(
      "[0][0].layers.wk")].shape == (36, 1024, 2560)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_update_step_exports_for_cuda(name):
  mesh, shapes, step = preset(name)
  args, kwargs = aot.update_args(QWEN3_4B, LORA, ROUTER, step, shapes, mesh)
  exported = aot.export(aot.train_step_fn(), args, kwargs, platform="cuda")
  assert exported.platforms == ("cuda",) and exported.nr_devices == 8
  marked, state = donated(exported, args)
  assert state > 10 and marked == state, (marked, state)
  assert mismatches(exported, args, kwargs)[0] == []


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", PRESETS)
def test_sampler_prefill_and_decode_step_export(name, platform):
  mesh, shapes, _ = preset(name)
  fn, args = aot.prefill_args(QWEN3_4B, LORA, shapes, mesh)
  prefill = aot.export(fn, args, platform=platform)
  assert prefill.platforms == (platform,) and mismatches(prefill, args) == ([], [])
  assert prefill.out_avals[0].shape == (shapes.sample_rows // 4, 1, QWEN3_4B.vocab_size)
  fn, args = aot.decode_args(QWEN3_4B, LORA, shapes, mesh)
  decode = aot.export(fn, args, platform=platform)
  assert mismatches(decode, args) == ([], [])
  model = ("model",)
  assert declared(decode, args, None, "[0][2].k") == ((), ("data",), model, (), ())
  # the cache is donated: its k and v buffers are reused for the new cache
  text = decode.mlir_module()
  header = text[text.index("func.func public @main("):text.index(") -> (")]
  donated = [int(i) for i in re.findall(r"%arg(\d+): [^%]*?(?:tf\.aliasing_output|jax\.buffer_donor)",
                                        header)]
  kept = list(decode.module_kept_var_idx)
  paths = [p for p, _ in aot.flat_inputs(args)]
  assert {"[0][2].k", "[0][2].v"} <= {paths[kept[i]] for i in donated}


@pytest.mark.parametrize("name", PRESETS)
def test_sampler_loop_exports_for_tpu(name):
  mesh, shapes, _ = preset(name)
  args, kwargs = aot.sample_args(QWEN3_4B, LORA, shapes, mesh)
  exported = aot.export(aot.sampler_fn(), args, kwargs, platform="tpu")
  assert mismatches(exported, args, kwargs) == ([], [])
  b = shapes.sample_rows
  assert [a.shape for a in exported.out_avals] == [(b, 1024), (b, 1024), (b,)]


@pytest.mark.parametrize("kernel", ("dense", "gather", "grouped", "merged"))
@pytest.mark.parametrize("name", PRESETS)
def test_mixture_kernels_export(name, kernel):
  mesh, _, _ = preset(name)
  args = aot.mixture_args(QWEN3_4B, LORA, rows=64, tokens=256, mesh=mesh, target="q")
  for platform in PLATFORMS:
    exported = aot.export(aot.mixture_fn(kernel, LORA.scale), args, platform=platform)
    assert mismatches(exported, args) == ([], [])
    assert exported.out_avals[0].shape == (64, 256, QWEN3_4B.q_size)
    assert declared(exported, args, None, "[0][1]") == (("model",), ())  # wq's heads


def _all_gathers(compiled_text):
  """Result shapes of the all-gathers in compiled HLO text."""
  return [tuple(int(d) for d in dims.split(",") if d) for dims in
          re.findall(r"= \w+\[([\d,]*)\]\{[^}]*\} all-gather(?:-start)?\(", compiled_text)]


# Small shapes for the compiled checks (a compile at Qwen3-4B shapes takes about a minute here).
SMALL = LlmConfig("qwen3", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True)
SMALL_LORA = LoraConfig(last_n_layers=1)


@pytest.mark.parametrize("kernel", ("dense", "gather", "grouped", "merged"))
def test_mixture_kernels_never_gather_the_whole_weight(eight_devices, kernel):
  # Compiled for 8 (fake CPU) devices on the tpu_v5e8 mesh: wq stays split over `model`.
  mesh = sharding.make_mesh(4, 2, eight_devices)
  args = aot.concrete(aot.mixture_args(SMALL, SMALL_LORA, rows=8, tokens=16,
                                       mesh=aot.abstract_mesh(4, 2)), mesh)
  text = aot.mixture_fn(kernel, SMALL_LORA.scale).trace(*args).lower().compile().as_text()
  assert args[1].shape == (64, 64)
  assert (64, 64) not in _all_gathers(text)


@pytest.mark.slow
def test_update_step_never_gathers_a_whole_backbone_weight(eight_devices):
  # The update compiled on the tpu_v5e8 mesh: Megatron-style layers need no gathered weight.
  mesh = sharding.make_mesh(4, 2, eight_devices)
  shapes = aot.RunShapes(nodes=2, routes_per_node=2, group_size=2, prompt_tokens=24,
                         max_new_tokens=8, micro_batches=2, embed_dim=64, data=4)
  args, kwargs = aot.update_args(SMALL, SMALL_LORA, ROUTER, StepConfig(micro_batches=2), shapes,
                                 aot.abstract_mesh(4, 2))
  args, kwargs = aot.concrete(args, mesh), aot.concrete(kwargs, mesh)
  text = aot.train_step_fn().trace(*args, **kwargs).lower().compile().as_text()
  weights = {tuple(x.shape) for x in jax.tree.leaves(args[0])
             if x.sharding.spec != jax.sharding.PartitionSpec()
             and any(a is not None for a in x.sharding.spec)}
  gathered = set(_all_gathers(text))
  assert weights and not weights & gathered, weights & gathered


@pytest.mark.slow
def test_remat_changes_memory_not_numbers():
  # StepConfig.remat recomputes each layer in the backward pass: same loss and gradients.
  import jax.numpy as jnp
  import numpy as np

  from morse_jax.llm.params import init_random
  from morse_jax.lora.experts import init_experts
  from morse_jax.lora.mixture import Adapter, uniform_routes
  from morse_jax.rl.logprobs import token_logprobs

  params = init_random(SMALL, jax.random.key(0))
  experts = init_experts(SMALL_LORA, SMALL, jax.random.key(1))
  experts = jax.tree.map(lambda a: a + 0.01, experts)  # B != 0, so the experts' grads flow
  tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, SMALL.vocab_size)
  mask = jnp.ones_like(tokens)

  def loss(experts, remat):
    adapter = Adapter(experts=experts, routes=uniform_routes([[0, 2], [1, 3]]),
                      layers=SMALL_LORA.adapted_layers(SMALL), scale=SMALL_LORA.scale)
    return jnp.sum(token_logprobs(params, SMALL, adapter, tokens, mask, remat=remat)[0])

  compiled = {r: jax.jit(jax.value_and_grad(loss), static_argnums=1).lower(experts, r).compile()
              for r in (False, True)}
  plain, remat = compiled[False](experts), compiled[True](experts)
  np.testing.assert_allclose(remat[0], plain[0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(remat[1]), jax.tree.leaves(plain[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert float(jnp.abs(jax.tree.leaves(plain[1])[0]).sum()) > 0
  # the gradient's temporaries shrink with remat (here: 2 layers of attention scores -> 1)
  temp = {r: c.memory_analysis().temp_size_in_bytes for r, c in compiled.items()}
  assert temp[True] < temp[False]


def test_fit_launcher_reports_the_presets_shapes_and_bytes(tmp_path):
  # Without compiling: the shapes of the tpu_v5e8 preset and the analytical bytes, by hand.
  import json
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "fit.json"
  done = subprocess.run(
      [sys.executable, "-m", "launchers.fit",
       "--config=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,tpu_v5e8", "--compile=false",
       f"--out={out}", "--name=v5e"], cwd=root, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "XLA:CPU's buffer assignment" in done.stdout
  entry = json.loads(out.read_text())["v5e"]
  assert (entry["mesh"], entry["micro_batches"], entry["remat"]) == ([4, 2], 16, True)
  assert (entry["update_rows"], entry["sample_rows"], entry["shared_prompts"]) == (64, 64, False)
  c = QWEN3_4B
  # bf16 backbone on a 4 x 2 mesh: every matrix split 2-way over `model`, norms whole
  norms = c.num_layers * (2 * c.hidden_size + 2 * c.head_dim) + c.hidden_size
  backbone = 2 * ((c.num_params() - norms) // 2 + norms)
  sampler = entry["programs"]["sampler"]["analytical"]
  # 64 rows / 4 over data, 8 kv heads / 2, 2048 + 1024 slots, k and v in bf16; while the 4
  # prompts' prefilled cache is repeated M = 4 times, both
  assert sampler["cache_per_row"] == 2 * 2 * 36 * 4 * 3072 * 128
  assert sampler["cache"] == (16 + 4) * sampler["cache_per_row"]
  assert backbone < sampler["arguments"] < backbone + 2 ** 27  # + experts, prompts, routes
  update = entry["programs"]["update"]["analytical"]
  assert update["arguments"] > backbone and "compiled_cpu" not in entry["programs"]["update"]


def _dot_operand_types(module_text):
  """The element types of the dot_general operands in an exported module."""
  dots = re.findall(r"stablehlo\.dot_general.*?-> tensor<[^>]*>", module_text)
  return set(re.findall(r"tensor<[0-9x]+x(bf16|f32)>, tensor", " ".join(dots)))


def test_platform_choices_follow_the_platform_lowered_for():
  """Choices made for XLA:CPU (16-bit attention products upcast, no ragged_dot kernel) are made
  when lowering, for the platform lowered for: a TPU or GPU export made on this CPU does not
  carry them."""
  bf16, f32 = jax.numpy.bfloat16, jax.numpy.float32
  q = jax.ShapeDtypeStruct((2, 16, SMALL.num_heads, SMALL.head_dim), bf16)
  kv = jax.ShapeDtypeStruct((2, SMALL.num_kv_heads, 16, SMALL.head_dim), bf16)
  valid = jax.ShapeDtypeStruct((2, 16), jax.numpy.bool_)
  attend = jax.jit(lambda q, k, v, valid: model_lib._attention(  # pylint: disable=protected-access
      q, k, v, attention.Visibility(0, valid), SMALL))
  types = {p: _dot_operand_types(aot.export(attend, (q, kv, kv, valid), platform=p).mlir_module())
           for p in ("cpu", "tpu", "cuda")}
  assert types == {"cpu": {"f32"}, "tpu": {"bf16"}, "cuda": {"bf16"}}, types
  # 16 experts, routes of 3, 256 tokens a row: the grouped kernel on accelerators only
  args = (jax.ShapeDtypeStruct((2, 256, 64), bf16), jax.ShapeDtypeStruct((64, 64), bf16), None,
          jax.ShapeDtypeStruct((16, 64, 4), bf16), jax.ShapeDtypeStruct((16, 4, 64), bf16),
          mixture.Routes(idx=jax.ShapeDtypeStruct((2, 3), jax.numpy.int32),
                         w=jax.ShapeDtypeStruct((2, 3), f32)))
  ragged = {p: "ragged_dot" in aot.export(aot.mixture_fn("auto", 1.0), args,
                                          platform=p).mlir_module()
            for p in ("cpu", "tpu", "cuda")}
  assert ragged == {"cpu": False, "tpu": True, "cuda": True}, ragged
