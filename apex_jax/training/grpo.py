"""One GRPO update of ONE APEx module's adapter from groups of its trajectories.

The three modules are the role experts of `LoraConfig(roles=("planner", "executor",
"distiller"), num_subtask_experts=0)` on one frozen backbone. A group is the G trajectories
sampled for one input (question, bucket); its rewards give the advantages

  A_i = clip((r_i - mean_group r) / (std_group r + eps), +-5),   0 when std_group r < 5e-4,

through `morse_jax.rl.update.Update` (the jitted step) with estimator "grpo", one route per
node (route id = group id) and no router; the optimiser state is donated to it, the experts are
not (the ablation rows read each stage's initial adapters). Every row runs with the expert set [role_index(module)],
so the other experts get exactly zero gradient; their slices are nonetheless copied back from
before the update, because AdamW's weight decay (and moments left from an earlier stage, were a
state ever shared) would move them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import llm
from morse_jax.llm import vl
from morse_jax.llm.sampling import bucket
from morse_jax.lora.experts import LoraConfig
from morse_jax.rl import batch as batch_lib
from morse_jax.rl import logprobs
from morse_jax.rl import metrics as metrics_lib
from morse_jax.rl import train_step as ts
from morse_jax.rl import update as update_lib
from morse_jax.rl import vl_inputs
from morse_jax.rl.batch import PolicyBatch

from apex_jax.agents import vl_generator
from apex_jax.agents.trajectory import MODULES, Trajectory
from apex_jax.tools import images as images_lib


def packed_batch(groups: Sequence[Sequence[Trajectory]], rewards: Sequence[Sequence[float]],
                 expert: int, *, pad_id: int = 0,
                 rows_multiple: int = 1) -> tuple[PolicyBatch, int]:
  """(PolicyBatch, num_routes): rows = the groups' trajectories in order, padded to a power of
  two (a multiple of rows_multiple); route = group id; groups padded to a power of two too, so
  the jitted step sees few distinct shapes. Loss mask 1 only on generated segments."""
  if not groups:
    raise ValueError("packed_batch: no groups")
  if len(rewards) != len(groups):
    raise ValueError(f"packed_batch: {len(rewards)} reward lists for {len(groups)} groups")
  rows, flat, route = [], [], []
  for g, (group, group_rewards) in enumerate(zip(groups, rewards)):
    if not group or len(group_rewards) != len(group):
      raise ValueError(f"packed_batch: group {g} has {len(group)} trajectories and "
                       f"{len(group_rewards)} rewards (need the same number, at least 1)")
    for traj in group:
      rows.append(traj.segments)
    flat.extend(float(r) for r in group_rewards)
    route.extend([g] * len(group))
  if not all(math.isfinite(r) for r in flat):
    raise ValueError(f"packed_batch: non-finite reward in {flat}")
  batch = batch_lib.update_batch(rows, flat, route, [[expert]] * len(rows), pad_id=pad_id,
                                 rows_multiple=rows_multiple)
  return batch, bucket(len(groups), minimum=1)


@functools.partial(jax.jit, static_argnames=("expert",))
def keep_only_expert(new, old, expert: int):
  """new's slice of `expert` on the K axis (axis 1 of a [la, K, ...] array), old's elsewhere."""
  def pick(n, o):
    mask = (jnp.arange(n.shape[1]) == expert).reshape((1, -1) + (1,) * (n.ndim - 2))
    return jnp.where(mask, n, o)
  return jax.tree.map(pick, new, old)


@dataclasses.dataclass
class ModuleUpdater:
  """The frozen backbone (an `llm.Model`, whose pad id pads the rows) and static settings;
  `update` trains one module's expert.

  recompute_logp_old: the sampler's log-probs are those of the filtered distribution when top-k
  or top-p is on; set True then, and the old log-probs are recomputed under the current experts.
  """

  model: llm.Model
  lora: LoraConfig
  step: ts.StepConfig = ts.StepConfig(estimator="grpo")
  kernel: str = "gather"  # the mixture kernel in the differentiated forward pass
  recompute_logp_old: bool = False
  # The update leaves flat groups out and runs a group's common prompt once (rl.compaction):
  # the same update for less compute.
  share_prompts: bool = True

  def __post_init__(self):
    missing = [m for m in MODULES if m not in self.lora.roles]
    if missing:
      raise ValueError(f"ModuleUpdater: LoraConfig.roles {self.lora.roles!r} lacks {missing}")
    if self.step.estimator != "grpo":
      raise ValueError(f"ModuleUpdater: StepConfig.estimator must be 'grpo' (one route per "
                       f"group, no router), got {self.step.estimator!r}")

  @property
  def step_update(self) -> update_lib.Update:
    """The update object of these settings (rebuilt when `step` is replaced; equal settings give
    an equal, so already compiled, object)."""
    return update_lib.Update(self.model.config, self.lora, self.step, kernel=self.kernel,
                             rows_multiple=self.step.micro_batches,
                             share_prompts=self.share_prompts, donate=("opt_states",))

  def init_opt_state(self, experts):
    """One optimiser state per module: moments of one stage never leak into another."""
    return self.step_update.init_opt_states(experts)

  def with_inputs(self, batch: PolicyBatch, groups) -> PolicyBatch:
    """The packed batch with whatever else its rows need (a text backbone: nothing)."""
    return batch

  def update(self, experts, opt_state, module: str, groups: Sequence[Sequence[Trajectory]],
             rewards: Sequence[Sequence[float]]):
    """Returns (experts, opt_state, metrics). Skipped (nothing changes, metrics["skipped"] 1)
    when no group's rewards differ (`advantages.flat_nodes`, the step's own rule): e.g. every
    rollout correct, or the skill gate fixed them all."""
    if module not in MODULES:
      raise ValueError(f"ModuleUpdater.update: module {module!r} not in {MODULES}")
    for g, group in enumerate(groups):
      wrong = [t.module for t in group if t.module != module]
      if wrong:
        raise ValueError(f"ModuleUpdater.update: group {g} holds {wrong[0]!r} trajectories, "
                         f"training {module!r}")
    expert = self.lora.role_index(module)
    batch, num_routes = packed_batch(groups, rewards, expert, pad_id=self.model.pad_id,
                                     rows_multiple=self.step.micro_batches)
    batch = self.with_inputs(batch, groups)
    update = self.step_update
    flat_groups = update.flat_nodes(batch, num_routes)  # the rule's one evaluation this update
    flat = np.concatenate([np.asarray(r, np.float64) for r in rewards])
    group_ids = np.concatenate([np.full(len(r), g) for g, r in enumerate(rewards)])
    metrics = dict(metrics_lib.reward_stats(flat, group_ids, self.step.min_reward_std,
                                            flat=flat_groups[:len(groups)]))
    metrics["generated_tokens"] = float(sum(t.generated_tokens() for g in groups for t in g))
    if flat_groups[:len(groups)].all():
      metrics.update(skipped=1.0)
      return experts, opt_state, metrics
    backbone = self.model.params
    if self.recompute_logp_old:
      batch = dataclasses.replace(batch, logp_old=logprobs.recompute(
          backbone, self.model.config, update.adapter(experts, batch.routes), batch.tokens,
          batch.attention_mask, batch.loss_mask, self.step.temperature))
    if self.step.kl_coef > 0:
      batch = dataclasses.replace(batch, logp_ref=logprobs.recompute(
          backbone, self.model.config, None, batch.tokens, batch.attention_mask,
          batch.loss_mask, self.step.temperature))
    new, _, (new_state, _), step_metrics, _ = update(
        backbone, experts, None, (opt_state[0], None), batch, None, num_routes=num_routes,
        flat=flat_groups, to_host=lambda m: {k: float(v) for k, v in jax.device_get(m).items()})
    new = keep_only_expert(new, experts, expert)
    metrics.update(step_metrics)
    return new, (new_state, opt_state[1]), metrics


@dataclasses.dataclass
class VlModuleUpdater(ModuleUpdater):
  """A ModuleUpdater on a Qwen2.5-VL backbone (`VlModuleUpdater.of(vl_model, lora)`): `model`
  is its language model, and each row's images (its trajectory's `info["images"]`, one per
  image block of its tokens) go through the frozen tower into the batch (`rl.vl_inputs`), so
  the LoRA experts on the language model learn from the tokens the images make. The recomputed
  old / reference log-probs would need the images too: refused until they take them."""

  vl_model: vl.VlModel | None = None
  share_prompts: bool = False  # the shared-prompt layout has no image inputs
  image_size: int = images_lib.IMAGE_SIZE  # as the generator's (`VlGenerator.image_size`)

  @classmethod
  def of(cls, vl_model: vl.VlModel, lora: LoraConfig, **settings) -> "VlModuleUpdater":
    return cls(model=vl_model.text, lora=lora, vl_model=vl_model, **settings)

  def __post_init__(self):
    super().__post_init__()
    if self.vl_model is None:
      raise ValueError("VlModuleUpdater.vl_model is None; build it with VlModuleUpdater.of")
    if self.recompute_logp_old or self.step.kl_coef > 0:
      raise ValueError("VlModuleUpdater: recompute_logp_old and StepConfig.kl_coef > 0 are not "
                       "supported on image rows yet (the recomputed log-probs take no images)")

  def with_inputs(self, batch: PolicyBatch, groups) -> PolicyBatch:
    rows = [vl_generator.pixels(traj.info.get("images", ()), self.image_size)
            for group in groups for traj in group]
    return vl_inputs.with_images(batch, self.vl_model, rows)


@dataclasses.dataclass
class FrozenUpdater(ModuleUpdater):
  """A ModuleUpdater that leaves every adapter as it is: its `update` returns the experts and
  optimiser state unchanged, with the rollouts' reward metrics (and `frozen` 1). A phase run
  with it keeps only its side effects on the memory bank (TTRL's stored episodes and evolved
  skills with the planner untrained: the w/o-planner-training ablation)."""

  @classmethod
  def of(cls, updater: ModuleUpdater) -> "FrozenUpdater":
    """The frozen twin of any ModuleUpdater (a VL one's too: it updates nothing, so it needs
    no images)."""
    return cls(**{f.name: getattr(updater, f.name) for f in dataclasses.fields(cls)})

  def update(self, experts, opt_state, module: str, groups: Sequence[Sequence[Trajectory]],
             rewards: Sequence[Sequence[float]]):
    if module not in MODULES:
      raise ValueError(f"FrozenUpdater.update: module {module!r} not in {MODULES}")
    flat = np.concatenate([np.asarray(r, np.float64) for r in rewards])
    group_ids = np.concatenate([np.full(len(r), g) for g, r in enumerate(rewards)])
    metrics = dict(metrics_lib.reward_stats(flat, group_ids, self.step.min_reward_std))
    metrics["generated_tokens"] = float(sum(t.generated_tokens() for g in groups for t in g))
    metrics.update(skipped=1.0, frozen=1.0)
    return experts, opt_state, metrics
