"""Mixture of LoRA experts: stacked role and subtask experts, per-row mixture kernels."""

from morse_jax.lora.experts import (ExpertWeights, LoraConfig, LoraConfigError, TARGETS,
                                    expert_param_count, init_experts, make_adapter,
                                    trainable_fraction)
from morse_jax.lora.mixture import (KERNELS, Adapter, Routes, adapted_linear, reference_delta,
                                    uniform_routes)
from morse_jax.lora.router import RouterConfig, RouterParams, init_router
