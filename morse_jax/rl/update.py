"""One update object, shared by MoRSE's `Trainer.step` and APEx's `ModuleUpdater.update`.

`Update` bundles the static settings once (a frozen, hashable dataclass: the jitted step's
static argument). Calling it on an update batch evaluates the flat-node rule once
(`advantages.flat_nodes`), leaves out what cannot move the update and shares prompts
(rl.compaction, given that result), runs the jitted step for `StepConfig.epochs` PPO epochs
(the router moves in the first only; the step gets the same result) with the train state
donated, and reports the step's metrics as the whole batch's.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm import sharding
from morse_jax.llm.config import LlmConfig
from morse_jax.lora import router as router_lib
from morse_jax.lora.experts import LoraConfig, adapter_of
from morse_jax.lora.mixture import Adapter
from morse_jax.rl import compaction
from morse_jax.rl import train_step as ts
from morse_jax.rl.advantages import flat_nodes
from morse_jax.rl.batch import PolicyBatch, RouterBatch


@dataclasses.dataclass(frozen=True)
class UpdateInfo:
  compacted: compaction.Compaction  # what was left out
  shape: tuple[int, ...]  # the token array the step ran on ([rows, T], or the shared layout's)
  flat: np.ndarray  # [nodes] bool: the flat-node rule's result (`Update.flat_nodes`)


@dataclasses.dataclass(frozen=True)
class Update:
  """The static settings of an update: model, adapters, step, router, layout.

  kernel: the mixture kernel of the differentiated forward pass. routes_per_node: B (1 for
  APEx's groups). rows_multiple: row counts are padded to a multiple of it (mesh data axis,
  micro-batches). share_prompts: each route's common prompt runs once (with one micro-batch).
  donate: the step's arguments given up to the result (`train_step.DONATED`); a caller that
  keeps its experts for later (APEx's ablation rows read each stage's initial adapters)
  donates the optimiser state only.
  """

  model: LlmConfig
  lora: LoraConfig
  step: ts.StepConfig
  router: router_lib.RouterConfig | None = None
  kernel: str = "gather"
  routes_per_node: int = 1
  rows_multiple: int = 1
  share_prompts: bool = True
  donate: tuple[str, ...] = ts.DONATED

  def __post_init__(self):
    for name in ("routes_per_node", "rows_multiple"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"Update.{name} must be an int >= 1, got {getattr(self, name)!r}")
    unknown = [d for d in self.donate if d not in ts.DONATED]
    if unknown:
      raise ValueError(f"Update.donate {self.donate!r}: {unknown} not in {ts.DONATED}")

  def adapter(self, experts, routes) -> Adapter:
    """The per-row adapter of the update's forward passes (experts + each row's route)."""
    return adapter_of(experts, routes, self.lora, self.model, self.kernel)

  def init_opt_states(self, experts, router_params=None):
    return ts.init_opt_states(experts, router_params, self.step)

  def flat_nodes(self, batch: PolicyBatch, num_routes: int) -> np.ndarray:
    """[num_routes / routes_per_node] bool: the nodes the step gives advantage 0 (the rule, on
    the host, in float32 as the step applies it)."""
    return flat_nodes(batch.rewards, batch.route, batch.valid,
                      num_nodes=num_routes // self.routes_per_node,
                      routes_per_node=self.routes_per_node, min_std=self.step.min_reward_std)

  @property
  def step_fn(self):
    """The jitted step (`train_step.train_step`, this object static, `donate` donated)."""
    return ts.jitted(self.donate)

  def __call__(self, backbone, experts, router_params, opt_states, batch: PolicyBatch,
               router_batch: RouterBatch | None, *, num_routes: int, flat=None,
               width: int | None = None, mesh=None,
               to_host: Callable[[dict], dict] = sharding.to_host):
    """Returns (experts, router_params, opt_states, metrics, UpdateInfo). The experts, router and
    optimiser state given are donated (see `donate`): use the returned ones.

    flat: `flat_nodes(batch, num_routes)` if the caller has it already. width: the shared
    layout's suffix slots (compaction.share_prefixes). metrics: the first epoch's (losses,
    entropy and norms of the rollout policy), clip_frac of the last (clipping can only happen
    after the first), brought to the host by `to_host` and patched by
    `Compaction.whole_batch`. mesh: rows are sharded over its data axis.
    """
    if flat is None:
      flat = self.flat_nodes(batch, num_routes)
    batch, compacted = compaction.for_update(batch, self.step, flat=flat,
                                             routes_per_node=self.routes_per_node,
                                             rows_multiple=self.rows_multiple,
                                             share_prompts=self.share_prompts, width=width)
    shape = tuple((batch.tokens if batch.shared is None else batch.shared.tokens).shape)
    if mesh is not None:
      place = sharding.shard_rows(mesh)
      batch = jax.tree.map(lambda x: place(x)[0], batch)
    step = self.step_fn
    for epoch in range(self.step.epochs):  # PPO epochs on this rollout
      experts, router_params, opt_states, epoch_metrics = step(
          backbone, experts, router_params, opt_states, batch, router_batch,
          jnp.asarray(epoch == 0), flat, update=self, num_routes=num_routes)
      if epoch == 0:
        first = epoch_metrics
    metrics = compacted.whole_batch(to_host(first))
    if self.step.epochs > 1:
      metrics["clip_frac"] = to_host({"clip_frac": epoch_metrics["clip_frac"]})["clip_frac"]
    return experts, router_params, opt_states, metrics, UpdateInfo(compacted, shape, flat)
