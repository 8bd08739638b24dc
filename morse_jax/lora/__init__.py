"""Mixture of LoRA experts: stacked role and subtask experts, per-row mixture kernels."""

from morse_jax.lora.experts import (ExpertWeights, LoraConfig, LoraConfigError, TARGETS,
                                    expert_axes, expert_param_count, init_experts, make_adapter,
                                    shard_experts, target_dims, trainable_fraction)
from morse_jax.lora.mixture import (KERNELS, Adapter, Routes, adapted_linear, reference_delta,
                                    uniform_routes)
from morse_jax.lora.router import (ROUTER_AXES, RouterConfig, RouterParams, init_router,
                                   shard_router)
