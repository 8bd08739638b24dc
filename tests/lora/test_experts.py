"""The experts' and the router's declared logical axes, and where the rules place them."""

import jax
from jax.sharding import PartitionSpec as P

from morse_jax import llm, lora
from morse_jax.llm import sharding
from morse_jax.lora import experts as experts_lib
from morse_jax.lora import router

# q 4 x 8 = 32 rows, kv 2 x 8 = 16, mlp 64
CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8)
LORA = lora.LoraConfig(targets=("q", "v", "o", "down"), last_n_layers=1, rank=4,
                       num_subtask_experts=4)


def test_experts_carry_the_adapted_weights_axes():
  experts = lora.init_experts(LORA, CONFIG, jax.random.key(0))
  axes = lora.expert_axes(experts)
  assert axes["q"].a == ("layers", "experts", "embed", "lora_rank")
  assert axes["q"].b == ("layers", "experts", "lora_rank", "heads")
  assert axes["v"].b[-1] == "kv_heads"
  assert axes["o"].a == ("layers", "experts", "heads", "lora_rank")
  assert (axes["down"].a[2], axes["down"].b[3]) == ("mlp", "embed")
  assert experts["o"].a.shape == (1, 6, 32, 4) and experts["down"].b.shape == (1, 6, 4, 32)
  assert lora.target_dims("down", CONFIG) == (64, 32)
  assert experts_lib.PEFT_MODULES == {
      "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
      "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
      "down": "mlp.down_proj"}


def test_rules_place_experts_and_router(eight_devices):
  mesh = sharding.make_mesh(2, 4)
  experts = lora.shard_experts(lora.init_experts(LORA, CONFIG, jax.random.key(0)), mesh)
  # B of q splits its 32 output rows like wq's heads; o's A its 32 input rows like wo's
  assert experts["q"].b.sharding.spec == P(None, None, None, "model")
  assert experts["o"].a.sharding.spec == P(None, None, "model", None)
  assert experts["q"].a.sharding.spec == P(None, None, None, None)
  params = router.init_router(router.RouterConfig(dim=8, top_k=2), 6, 4, jax.random.key(1))
  placed = lora.shard_router(params, mesh, sharding.ShardingRules(router="model", experts="data"))
  assert placed.proj.sharding.spec == P(None, "model")
  assert placed.prototypes.sharding.spec == P("data", "model")
  assert lora.shard_router(params, mesh).proj.sharding.spec == P(None, None)  # default: replicated
