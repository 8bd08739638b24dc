"""A route as a standard PEFT LoRA adapter, or merged into full Hugging Face weights.

With uniform weights 1/|E|, a mixture of |E| rank-r experts is exactly one rank |E|*r LoRA:
  scale * sum_k (1/|E|) (x A_k) B_k = (alpha'/r') * x [A_1 .. A_E] [B_1/|E| ; .. ; B_E/|E|]
with r' = |E| r and alpha' = |E| alpha (so alpha'/r' = alpha/r). vLLM or peft can serve it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import jax
import numpy as np
from safetensors.numpy import save_file

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.params import Params
from morse_jax.lora.experts import PEFT_MODULES, TARGETS, LoraConfig


def route_as_lora(experts, lora: LoraConfig, route: Sequence[int]):
  """{target: (A' [la, in, |E| r], B' [la, |E| r, out])} and the exported alpha."""
  route = lora.check_route(route)
  out = {}
  for target, e in jax.device_get(experts).items():
    a = np.concatenate([np.asarray(e.a[:, k], np.float32) for k in route], axis=-1)
    b = np.concatenate([np.asarray(e.b[:, k], np.float32) / len(route) for k in route], axis=-2)
    out[target] = (a, b)
  return out, lora.alpha * len(route)


def export_peft(experts, lora: LoraConfig, model: LlmConfig, route: Sequence[int], path: str,
                base_model: str = "") -> None:
  """Writes adapter_config.json and adapter_model.safetensors for one route."""
  merged, alpha = route_as_lora(experts, lora, route)
  layers = lora.adapted_layers(model)
  rank = lora.rank * len(route)
  tensors = {}
  for target, (a, b) in merged.items():
    for slot, layer in enumerate(layers):
      prefix = f"base_model.model.model.layers.{layer}.{PEFT_MODULES[target]}"
      tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[slot].T)  # [r', in]
      tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[slot].T)  # [out, r']
  os.makedirs(path, exist_ok=True)
  save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
  config = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
      "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
      "target_modules": sorted(PEFT_MODULES[t].split(".")[-1] for t in lora.targets),
      "layers_to_transform": list(layers), "fan_in_fan_out": False, "use_rslora": False,
      "init_lora_weights": True, "inference_mode": True,
  }
  with open(os.path.join(path, "adapter_config.json"), "w") as f:
    json.dump(config, f, indent=2)


def merge_route(params: Params, experts, lora: LoraConfig, model: LlmConfig,
                route: Sequence[int]) -> Params:
  """Backbone weights with the route's delta folded in (save with `llm.save`)."""
  merged, _ = route_as_lora(experts, lora, route)
  layers = dict(jax.device_get(dataclasses.asdict(params.layers)))
  for target, (a, b) in merged.items():
    field = TARGETS[target][0]
    w = np.array(layers[field], np.float32)  # [L, out, in]
    for slot, layer in enumerate(lora.adapted_layers(model)):
      w[layer] += lora.scale * (a[slot] @ b[slot]).T
    layers[field] = w.astype(layers[field].dtype)
  return dataclasses.replace(params, layers=type(params.layers)(**layers))
