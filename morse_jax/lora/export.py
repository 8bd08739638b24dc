"""A route as a standard PEFT LoRA adapter, or merged into full Hugging Face weights.

With uniform weights 1/|E|, a mixture of |E| rank-r experts is exactly one rank |E|*r LoRA:
  scale * sum_k (1/|E|) (x A_k) B_k = (alpha'/r') * x [A_1 .. A_E] [B_1/|E| ; .. ; B_E/|E|]
with r' = |E| r and alpha' = |E| alpha (so alpha'/r' = alpha/r). vLLM or peft can serve it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Sequence

import jax
import numpy as np
from safetensors.numpy import save_file

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.params import Params
from morse_jax.lora.experts import ExpertWeights, LoraConfig, PEFT_MODULES, target_dims, TARGETS


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
    field = TARGETS[target]
    w = np.array(layers[field], np.float32)  # [L, out, in]
    for slot, layer in enumerate(lora.adapted_layers(model)):
      w[layer] += lora.scale * (a[slot] @ b[slot]).T
    layers[field] = w.astype(layers[field].dtype)
  return dataclasses.replace(params, layers=type(params.layers)(**layers))


class PeftAdapterError(ValueError):
  """A PEFT adapter folder cannot be read as one LoRA expert; the message names the file and
  the field or tensor."""


_UNSUPPORTED = {"use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
                "bias": "none"}  # settings whose math our adapted_linear does not do


def import_peft(path: str, model: LlmConfig) -> tuple[dict, LoraConfig]:
  """(experts, lora) of a PEFT LoRA adapter folder (adapter_config.json +
  adapter_model.safetensors, as peft's save_pretrained or `export_peft` write it): one expert
  (role "adapter", id 0) whose route [0] computes what peft computes. The adapted layers are
  read from the tensor names."""

  from safetensors.numpy import load_file

  cfg_path = os.path.join(path, "adapter_config.json")
  try:
    with open(cfg_path) as f:
      cfg = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise PeftAdapterError(f"{cfg_path}: cannot read the adapter config: {e}") from None
  if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
    raise PeftAdapterError(f"{cfg_path}: peft_type must be 'LORA', got "
                           f"{cfg.get('peft_type') if isinstance(cfg, dict) else cfg!r}")
  for key, ok in _UNSUPPORTED.items():
    if cfg.get(key, ok) not in (ok, None):
      raise PeftAdapterError(f"{cfg_path}: {key}={cfg[key]!r} is not supported (need {ok!r})")
  for key in ("rank_pattern", "alpha_pattern"):
    if cfg.get(key):
      raise PeftAdapterError(f"{cfg_path}: {key} {cfg[key]!r} is not supported (one rank and "
                             f"alpha for every module)")
  rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
    raise PeftAdapterError(f"{cfg_path}: r must be a positive integer, got {rank!r}")
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
    raise PeftAdapterError(f"{cfg_path}: lora_alpha must be a positive number, got {alpha!r}")
  weights_path = os.path.join(path, "adapter_model.safetensors")
  try:
    tensors = load_file(weights_path)
  except Exception as e:  # noqa: BLE001 -- safetensors raises several types for a bad file
    raise PeftAdapterError(f"{weights_path}: cannot read the adapter weights: {e}") from None
  by_module = {v: k for k, v in PEFT_MODULES.items()}
  pattern = re.compile(r"(?:.*\.)?layers\.(\d+)\.(\w+\.\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
  found: dict[tuple[str, int], dict[str, np.ndarray]] = {}
  for name, value in tensors.items():
    m = pattern.match(name)
    if m is None or m.group(2) not in by_module:
      raise PeftAdapterError(f"{weights_path}: tensor {name!r} is not a LoRA A/B weight of "
                             f"{sorted(PEFT_MODULES.values())}")
    found.setdefault((by_module[m.group(2)], int(m.group(1))), {})[m.group(3)] = value
  if not found:
    raise PeftAdapterError(f"{weights_path}: no LoRA tensors")
  targets = tuple(t for t in TARGETS if any(k[0] == t for k in found))
  layers = tuple(sorted({layer for _, layer in found}))
  missing = [f"{t} layer {i}" for t in targets for i in layers
             if set(found.get((t, i), {})) != {"A", "B"}]
  if missing:
    raise PeftAdapterError(f"{weights_path}: every target needs lora_A and lora_B in every "
                           f"adapted layer; missing {missing[:4]}")
  lora = LoraConfig(targets=targets, layers=layers, rank=rank, alpha=float(alpha),
                    roles=("adapter",), num_subtask_experts=0)
  lora.adapted_layers(model)  # raises on a layer the model does not have
  experts = {}
  for t in targets:
    d_in, d_out = target_dims(t, model)
    a = np.stack([found[(t, i)]["A"].T for i in layers])[:, None].astype(np.float32)
    b = np.stack([found[(t, i)]["B"].T for i in layers])[:, None].astype(np.float32)
    if a.shape[1:] != (1, d_in, rank) or b.shape[1:] != (1, rank, d_out):
      raise PeftAdapterError(f"{weights_path}: {PEFT_MODULES[t]} A {a.shape[2:]} / B "
                             f"{b.shape[2:]} do not fit the model ({d_in} -> {d_out}, "
                             f"rank {rank})")
    experts[t] = ExpertWeights(jax.numpy.asarray(a), jax.numpy.asarray(b))
  return experts, lora
