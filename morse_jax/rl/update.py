"""One update from an update batch, shared by MoRSE's `Trainer.step` and APEx's
`ModuleUpdater.update`: leave out what cannot move it and share prompts (rl.compaction), run the
jitted step for `StepConfig.epochs` PPO epochs (the router moves in the first only), and report
the step's metrics as the whole batch's.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from morse_jax.llm import sharding
from morse_jax.rl import compaction
from morse_jax.rl import train_step as ts
from morse_jax.rl.batch import PolicyBatch, RouterBatch


@dataclasses.dataclass(frozen=True)
class UpdateInfo:
  compacted: compaction.Compaction  # what was left out
  shape: tuple[int, ...]  # the token array the step ran on ([rows, T], or the shared layout's)


def run(backbone, experts, router_params, opt_states, batch: PolicyBatch,
        router_batch: RouterBatch | None, *, config, router_config, step_config: ts.StepConfig,
        layers: tuple[int, ...], scale: float, kernel: str, routes_per_node: int,
        num_routes: int, rows_multiple: int = 1, share_prompts: bool = True,
        width: int | None = None, mesh=None,
        to_host: Callable[[dict], dict] = sharding.to_host):
  """Returns (experts, router_params, opt_states, metrics, UpdateInfo).

  metrics: the first epoch's (losses, entropy and norms of the rollout policy), clip_frac of the
  last (clipping can only happen after the first), brought to the host by `to_host` and
  patched by `Compaction.whole_batch`. mesh: rows are sharded over its data axis.
  """
  batch, compacted = compaction.for_update(batch, step_config, routes_per_node=routes_per_node,
                                           rows_multiple=rows_multiple,
                                           share_prompts=share_prompts, width=width)
  shape = tuple((batch.tokens if batch.shared is None else batch.shared.tokens).shape)
  if mesh is not None:
    place = sharding.shard_rows(mesh)
    batch = jax.tree.map(lambda x: place(x)[0], batch)
  for epoch in range(step_config.epochs):  # PPO epochs on this rollout
    experts, router_params, opt_states, epoch_metrics = ts.train_step(
        backbone, experts, router_params, opt_states, batch, router_batch, config=config,
        router_config=router_config, step_config=step_config, layers=layers, scale=scale,
        kernel=kernel, routes_per_node=routes_per_node, num_routes=num_routes,
        update_router=jnp.asarray(epoch == 0))
    if epoch == 0:
      first = epoch_metrics
  metrics = compacted.whole_batch(to_host(first))
  if step_config.epochs > 1:
    metrics["clip_frac"] = to_host({"clip_frac": epoch_metrics["clip_frac"]})["clip_frac"]
  return experts, router_params, opt_states, metrics, UpdateInfo(compacted, shape)
