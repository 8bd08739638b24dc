"""What `launchers.fit` measures for a config: the backbone, adapters, update settings and
shapes of a MoRSE run or of one APEx stage (`plan`; the executor stage on the config's
Qwen2.5-VL executor when it names one), and the chips it is compared with. Kept
apart from the launcher so that tests read it without defining the launcher's flags."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, NamedTuple

from absl import app

GIB = 2 ** 30
# Memory per chip in GiB: v5e 16 GiB HBM; the GPUs as nvidia-smi reports them (40960, 81559 and
# about 143000 MiB). JAX on GPU preallocates 75% unless XLA_PYTHON_CLIENT_MEM_FRACTION says more.
ACCELERATORS = (("TPU v5e", 16), ("A100-40GB", 40), ("H100-80GB", 79.6), ("H200-141GB", 139))


class Plan(NamedTuple):
  """What one run's check measures: the backbone, adapters, update settings and shapes."""

  name: str  # the architecture's name or folder
  model: Any  # LlmConfig
  lora: Any  # LoraConfig
  router: Any  # RouterConfig | None
  step: Any  # StepConfig, with the micro-batches the run's update uses
  shapes: Any  # aot.RunShapes
  mesh: tuple[int, int]  # (data, model)
  vision: Any = None  # the VisionConfig of a Qwen2.5-VL backbone (APEx's executor), else None


def plan(config, *, stage: str = "planner", prompt_tokens: int = 2048, nodes: int = 0,
         model: str = "", mesh: str = "") -> Plan:
  """The `Plan` of a MoRSE config or of one APEx stage (`stage`; config.system "apex"); the
  other arguments are the flags of the same names (see there)."""
  if config.get("system") == "apex":
    return _apex(config, stage, model, mesh)
  return _morse(config, prompt_tokens, nodes, model, mesh)


def _architecture(config, default_name: str, model_name: str = ""):
  from morse_jax.llm.config import LlmConfig
  from morse_jax.llm.presets import ARCHITECTURES

  path = os.path.expanduser(config.model.get("path", "") or "")
  if path and os.path.exists(os.path.join(path, "config.json")):
    with open(os.path.join(path, "config.json")) as f:
      return path, LlmConfig.from_hf_dict(json.load(f), os.path.join(path, "config.json"))
  name = model_name or config.model.get("name", "") or default_name
  if name not in ARCHITECTURES:
    raise app.UsageError(f"--model / config.model.name {name!r} is not in "
                         f"llm.presets.ARCHITECTURES {sorted(ARCHITECTURES)}; give "
                         "--config.model.path")
  return name, ARCHITECTURES[name]


def _mesh_shape(text: str, default):
  if not text:
    return default
  try:
    data, model = (int(x) for x in text.lower().split("x"))
  except ValueError:
    raise app.UsageError(f"--mesh={text!r}: expected DATAxMODEL, e.g. 4x2") from None
  return data, model


def _morse(config, prompt_tokens, nodes, model_name, mesh):
  from morse_jax.experiments import experiment
  from morse_jax.rl import aot

  name, model = _architecture(config, "", model_name)
  lora, router = experiment.lora_config(config), experiment.router_config(config)
  train = experiment.train_config(config)
  step = train.step
  data, model_axis = _mesh_shape(mesh, (config.mesh.data, config.mesh.model))
  rollout = experiment.rollout_config(train, router is not None)
  shapes = aot.RunShapes(
      nodes=nodes or train.tasks_per_step,
      routes_per_node=rollout.routes_per_node, group_size=rollout.group_size,
      prompt_tokens=prompt_tokens, max_new_tokens=rollout.max_new_tokens,
      micro_batches=step.micro_batches, share_prompts=rollout.share_prompts,
      route_width=1 + (config.router.top_k if router is not None else 0),
      embed_dim=model.hidden_size, data=data)
  return Plan(name, model, lora, router, step, shapes, (data, model_axis))


def _apex_stage(config, name: str):
  """config.stages[name], or config.ttrl for "ttrl" (its batch, group and lengths)."""
  if name == "ttrl":
    return config.ttrl
  if name not in config.stages:
    raise app.UsageError(f"--stage={name!r}: not in config.stages {sorted(config.stages)} "
                         "nor 'ttrl'")
  return config.stages[name]


def _apex(config, stage_name, model_name, mesh_text):
  """One APEx stage: batch x group rows of its prompt and response lengths, each module a role
  expert (no router), on config.mesh (else 8 x 1) with the stage's micro-batches."""
  from apex_jax import experiment
  from morse_jax.rl import aot

  stage = _apex_stage(config, stage_name)
  vl_config = _vl_executor(config) if stage_name == "executor" and not model_name else None
  if vl_config is not None:
    name, model = config.executor_model.get("path") or config.executor_model.preset, vl_config.text
  else:
    name, model = _architecture(config, "Qwen3-8B", model_name)
  response = stage.max_new_tokens
  prompt = stage.agents.max_context_tokens - response
  lora = experiment.lora_config(config)
  step = experiment.train_config(config).step
  mesh = config.get("mesh") or {"data": 8, "model": 1}
  data, model_axis = _mesh_shape(mesh_text, (mesh["data"], mesh["model"]))
  micro_batches = stage.get("micro_batches", 0) or step.micro_batches  # the stage's, as it runs
  step = dataclasses.replace(step, micro_batches=micro_batches)
  shapes = aot.RunShapes(nodes=stage.batch_size, routes_per_node=1, group_size=stage.group_size,
                         prompt_tokens=prompt, max_new_tokens=response,
                         micro_batches=micro_batches, route_width=1,
                         embed_dim=model.hidden_size, data=data, **_images(config, vl_config))
  return Plan(name, model, lora, None, step, shapes, (data, model_axis),
              None if vl_config is None else vl_config.vision)


def _vl_executor(config):
  """The executor's VlConfig (config.executor_model: its folder's config.json, else its
  preset in llm.presets.VL_HF_CONFIGS), or None when the config names no VL executor."""
  from morse_jax.llm import vl
  from morse_jax.llm.presets import vl_preset

  executor = config.get("executor_model") or {}
  path = os.path.expanduser(executor.get("path", "") or "")
  if path and os.path.exists(os.path.join(path, "config.json")):
    with open(os.path.join(path, "config.json")) as f:
      return vl.VlConfig.from_hf_dict(json.load(f), os.path.join(path, "config.json"))
  return vl_preset(executor["preset"]) if executor.get("preset") else None


def _images(config, vl_config) -> dict:
  """RunShapes' image fields: each executor row at most the question's image and the image
  search's results (config.image_search.max_results), 448 x 448 each."""
  from morse_jax.llm import vision

  if vl_config is None:
    return {}
  search = config.get("image_search") or {}
  return dict(images=1 + int(search.get("max_results", 0)),
              image_tokens=vl_config.image_tokens(vision.image_grid(vl_config.vision)))


def fits(total_bytes: float) -> dict[str, bool]:
  return {label: total_bytes <= gib * GIB for label, gib in ACCELERATORS}
