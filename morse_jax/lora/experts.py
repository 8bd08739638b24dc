"""Role and subtask LoRA experts: for each adapted projection, all experts in one array.

  A[target]: [la, K, d_in, r] ~ N(0, init_std)     B[target]: [la, K, r, d_out] = 0
la = adapted layers, K = roles + subtask experts (experts 0..len(roles)-1 are the role experts).
The adapted projection is  x W + (alpha / r) * sum_k w_k (x A_k) B_k.
d_in, d_out and their logical axes are the adapted weight's (`llm.params.WEIGHTS`, [out, in]), so
the experts are sharded as that weight is (`expert_axes`, `shard_experts`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from morse_jax.llm import sharding
from morse_jax.llm.config import LlmConfig
from morse_jax.llm.params import WEIGHTS, Weight
from morse_jax.lora.mixture import Adapter, uniform_routes

# target name -> the LayerParams field it adapts
TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up",
           "down": "w_down"}


def target_weight(target: str) -> Weight:
  """The declaration of the weight that `target` adapts."""
  return getattr(WEIGHTS.layers, TARGETS[target])


def target_dims(target: str, model: LlmConfig) -> tuple[int, int]:
  """(d_in, d_out) of the adapted projection."""
  _, d_out, d_in = target_weight(target).shape(model)
  return d_in, d_out


# target -> the module PEFT names in a layer ("self_attn.q_proj"), from the weight's HF name
PEFT_MODULES = {t: target_weight(t).hf.removeprefix("model.layers.{i}.").removesuffix(".weight")
                for t in TARGETS}


class LoraConfigError(ValueError):
  """A LoRA setting is invalid; the message names the field and the value."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which projections and layers carry experts, and how many. Defaults: the authors' setup."""

  targets: tuple[str, ...] = ("q", "v", "o")
  layers: tuple[int, ...] | None = None  # explicit indices (negative count from the end)
  last_n_layers: int = 8  # used when `layers` is None
  rank: int = 8
  alpha: float = 16.0
  roles: tuple[str, ...] = ("execute", "merge")
  num_subtask_experts: int = 4
  init_std: float = 0.02

  def __post_init__(self):
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown or not self.targets:
      raise LoraConfigError(f"LoraConfig.targets: unknown target {unknown or self.targets!r} "
                            f"(known: {tuple(TARGETS)})")
    if len(set(self.targets)) != len(self.targets):
      raise LoraConfigError(f"LoraConfig.targets has duplicates: {self.targets!r}")
    if not isinstance(self.rank, int) or self.rank <= 0:
      raise LoraConfigError(f"LoraConfig.rank must be a positive integer, got {self.rank!r}")
    if self.num_subtask_experts < 0:
      raise LoraConfigError(
          f"LoraConfig.num_subtask_experts must be >= 0, got {self.num_subtask_experts!r}")
    if self.num_experts == 0:
      raise LoraConfigError("LoraConfig: no experts (roles is empty and num_subtask_experts is 0)")
    if len(set(self.roles)) != len(self.roles):
      raise LoraConfigError(f"LoraConfig.roles has duplicates: {self.roles!r}")
    if self.layers is None and self.last_n_layers <= 0:
      raise LoraConfigError(f"LoraConfig.last_n_layers must be > 0, got {self.last_n_layers!r}")

  @property
  def num_experts(self) -> int:
    return len(self.roles) + self.num_subtask_experts

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def role_index(self, role: str) -> int:
    if role not in self.roles:
      raise LoraConfigError(f"unknown role {role!r} (roles: {self.roles})")
    return self.roles.index(role)

  def subtask_index(self, j: int) -> int:
    """Expert id of subtask expert j."""
    if not 0 <= j < self.num_subtask_experts:
      raise LoraConfigError(f"subtask expert {j} does not exist "
                            f"(num_subtask_experts={self.num_subtask_experts})")
    return len(self.roles) + j

  def check_route(self, route, what: str = "route") -> list[int]:
    """The route's expert ids as ints; raises if it is empty, repeats or names a missing expert."""
    route = [int(k) for k in route]
    if not route:
      raise LoraConfigError(f"{what} is empty: it needs at least one expert id")
    bad = [k for k in route if not 0 <= k < self.num_experts]
    if bad:
      raise LoraConfigError(f"{what} names expert {bad[0]}, which does not exist "
                            f"(num_experts={self.num_experts})")
    if len(set(route)) != len(route):
      raise LoraConfigError(f"{what} repeats an expert: {route}")
    return route

  def adapted_layers(self, model: LlmConfig) -> tuple[int, ...]:
    """Sorted, validated layer indices."""
    n = model.num_layers
    if self.layers is None:
      if self.last_n_layers > n:
        raise LoraConfigError(f"LoraConfig.last_n_layers={self.last_n_layers} but the model has "
                              f"{n} layers")
      return tuple(range(n - self.last_n_layers, n))
    out = []
    for i in self.layers:
      if not -n <= i < n:
        raise LoraConfigError(f"LoraConfig.layers: index {i} is out of range for a model with "
                              f"{n} layers")
      out.append(i % n)
    if len(set(out)) != len(out):
      raise LoraConfigError(f"LoraConfig.layers has duplicates: {self.layers!r}")
    return tuple(sorted(out))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ExpertWeights:
  a: jax.Array  # [la, K, d_in, r]
  b: jax.Array  # [la, K, r, d_out]


def expert_axes(experts: dict) -> dict:
  """{target: ExpertWeights of logical axis names} for `experts`' targets: d_in and d_out carry
  the adapted weight's axes (q's d_out is split like wq's heads, o's d_in like wo's)."""
  out = {}
  for target in experts:
    _, out_axis, in_axis = target_weight(target).axes
    out[target] = ExpertWeights(a=("layers", "experts", in_axis, "lora_rank"),
                                b=("layers", "experts", "lora_rank", out_axis))
  return out


def shard_experts(experts: dict, mesh, rules: sharding.ShardingRules = sharding.ShardingRules()):
  """The experts placed on `mesh` by their logical axes."""
  return sharding.shard(experts, expert_axes(experts), mesh, rules)


def init_experts(lora: LoraConfig, model: LlmConfig, key: jax.Array,
                 dtype=jnp.float32) -> dict[str, ExpertWeights]:
  """A ~ N(0, init_std), B = 0: every expert starts as the identity edit."""
  layers = len(lora.adapted_layers(model))
  out = {}
  for target, k in zip(lora.targets, jax.random.split(key, len(lora.targets))):
    d_in, d_out = target_dims(target, model)
    out[target] = ExpertWeights(
        a=(lora.init_std * jax.random.normal(
            k, (layers, lora.num_experts, d_in, lora.rank))).astype(dtype),
        b=jnp.zeros((layers, lora.num_experts, lora.rank, d_out), dtype))
  return out


def expert_param_count(lora: LoraConfig, model: LlmConfig) -> int:
  layers = len(lora.adapted_layers(model))
  per_expert = sum(lora.rank * sum(target_dims(t, model)) for t in lora.targets)
  return layers * lora.num_experts * per_expert


def trainable_fraction(lora: LoraConfig, model: LlmConfig, router_dim: int = 128,
                       router_input_dim: int | None = None) -> float:
  """(experts + router projection + prototypes) / (backbone + all of those)."""
  router = (router_input_dim or model.hidden_size) * router_dim
  router += lora.num_subtask_experts * router_dim
  trainable = expert_param_count(lora, model) + router
  return trainable / (model.num_params() + trainable)


def adapter_of(experts, routes, lora: LoraConfig, model: LlmConfig, kernel: str) -> Adapter:
  """The one constructor of the per-row Adapter (sampler, update, lowering checks): the experts,
  each row's route, and the layers and scale `lora` adapts."""
  return Adapter(experts=experts, routes=routes, layers=lora.adapted_layers(model),
                 scale=lora.scale, kernel=kernel)


def make_adapter(experts: dict[str, ExpertWeights], lora: LoraConfig, model: LlmConfig,
                 expert_sets, kernel: str = "auto", width: int | None = None):
  """An Adapter for rows whose experts are `expert_sets[row]` (uniform weights 1/|E|).

  Validates every expert id. With kernel "auto", a batch whose rows all share one route uses the
  `merged` kernel (the delta folded into W once per call); otherwise the shape heuristic applies.
  """
  expert_sets = [lora.check_route(s, f"route of row {row}") for row, s in enumerate(expert_sets)]
  if kernel == "auto" and len({tuple(s) for s in expert_sets}) == 1:
    kernel = "merged"
  return adapter_of(experts, uniform_routes(expert_sets, width), lora, model, kernel)
