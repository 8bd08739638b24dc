"""The fixed-LoRA baseline (fixed_grpo) trains as many parameters per call as a mole call
activates: one role LoRA of rank r(1+K) against the role expert + K subtask experts of rank r."""

import jax
import pytest

from configs.morse import common
from morse_jax import llm
from morse_jax.lora.experts import expert_param_count, init_experts
from morse_jax.experiments import experiment

# Grouped-query attention, so q, v and o have three different (d_in, d_out) shapes.
MODEL = llm.LlmConfig("qwen3", vocab_size=64, hidden_size=48, intermediate_size=96, num_layers=4,
                      num_heads=6, num_kv_heads=2, head_dim=8)


def per_expert_from_shapes(lora):
  """Parameters of one expert, read off the initialised A and B arrays (no allocation)."""
  shapes = jax.eval_shape(lambda: init_experts(lora, MODEL, jax.random.key(0)))
  total = 0
  for weights in shapes.values():
    la, _, d_in, r = weights.a.shape
    _, _, r_b, d_out = weights.b.shape
    assert r_b == r
    total += la * (d_in * r + r * d_out)
  return total


@pytest.mark.parametrize("rank,top_k,subtask", [(8, 2, 4), (4, 1, 4), (2, 3, 6)])
def test_fixed_lora_matches_mole_activated_parameters_per_call(rank, top_k, subtask):
  configs = {}
  for variant in ("mole_hgrpo", "fixed_grpo"):
    c = common.apply(common.base(), f"{variant},qwen3_4b,cpu", "humaneval")
    c.lora.rank, c.lora.last_n_layers, c.lora.num_subtask_experts = rank, 3, subtask
    c.router.top_k = top_k
    configs[variant] = experiment.lora_config(c)
  mole, fixed = configs["mole_hgrpo"], configs["fixed_grpo"]
  assert fixed.num_subtask_experts == 0 and fixed.roles == mole.roles
  assert fixed.rank == rank * (1 + top_k) and fixed.alpha == mole.alpha
  # The fixed scale alpha/(r(1+K)) is the mole scale alpha/r times the uniform weight 1/(1+K).
  assert fixed.scale == pytest.approx(mole.scale / (1 + top_k))
  activated = (1 + top_k) * per_expert_from_shapes(mole)  # role + K subtask experts
  assert per_expert_from_shapes(fixed) == activated  # one role expert per fixed call
  assert (expert_param_count(fixed, MODEL) / fixed.num_experts
          == (1 + top_k) * expert_param_count(mole, MODEL) / mole.num_experts == activated)


def test_no_lora_without_a_mixture():
  c = common.apply(common.base(), "single,qwen3_4b,cpu", "humaneval")
  assert experiment.lora_config(c) is None
