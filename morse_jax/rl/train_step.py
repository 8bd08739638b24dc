"""One jitted HGRPO (or GRPO) update of the experts and the router; the backbone stays frozen.

The experts learn only from the clipped-surrogate loss on generated tokens (advantages `within`,
or GRPO's shared advantage); the router learns only from its cross-route loss plus regularisers.
They are separate parameter trees with separate AdamW optimisers, so neither gets the other's
gradient. Advantages are computed inside the step from the rows' rewards (segment sums), so on a
mesh the route and node means are reduced across devices (and hosts) by the compiler.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from morse_jax.lora import router as router_lib
from morse_jax.rl.advantages import ESTIMATORS, MIN_REWARD_STD, row_advantages
# PolicyBatch, RouterBatch and token_logprobs are re-exported: they live in rl.batch / rl.logprobs.
from morse_jax.rl.batch import PolicyBatch, RouterBatch  # noqa: F401
from morse_jax.rl.logprobs import entropy as entropy_of
from morse_jax.rl.logprobs import shared_token_logprobs, token_logprobs
from morse_jax.rl.losses import AGGREGATIONS, aggregate_parts, policy_loss, router_loss

# `update` arguments below are `rl.update.Update`s (named, not imported: that module imports this
# one).


@dataclasses.dataclass(frozen=True)
class StepConfig:
  expert_lr: float = 8e-5
  router_lr: float = 3e-5
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  epsilon: float = 0.2
  epsilon_high: float | None = None
  aggregation: str = "token-mean"
  # seq-mean-token-sum-norm's constant divisor (Dr. GRPO: the generation budget). It must not be
  # the padded width, which changes with the batch's layout; the MoRSE trainer fills in its
  # max_new_tokens when None.
  norm_len: int | None = None
  alpha_pi: float = 0.15
  kl_coef: float = 0.0
  estimator: str = "hgrpo"  # or "grpo" (the paper's ablation)
  advantage_clip: float | None = 5.0  # 0 or None: no clip
  normalize_advantages: bool = True
  min_reward_std: float = MIN_REWARD_STD
  micro_batches: int = 1  # gradient accumulation: rows split into this many passes
  # PPO epochs over one rollout (mu; TRL's num_iterations): the trainer calls the step this many
  # times on the same rows and advantages (the ratio is against the sampling log-probs). The
  # router moves in the first only: its loss is a plain policy gradient with no ratio, so a
  # second pass would be off-policy.
  epochs: int = 1
  temperature: float = 1.0  # the rollout's sampling temperature (0, greedy, counts as 1)
  # Recompute each layer in the backward pass (llm.model.forward's remat): the update holds one
  # layer's attention scores instead of all of them (launchers.fit measures the difference).
  remat: bool = False

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"StepConfig.aggregation {self.aggregation!r} not in {AGGREGATIONS}")
    if self.estimator not in ESTIMATORS:
      raise ValueError(f"StepConfig.estimator {self.estimator!r} not in {ESTIMATORS}")
    for name in ("micro_batches", "epochs"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"StepConfig.{name} must be an int >= 1, got "
                         f"{getattr(self, name)!r}")
    for name in ("expert_lr", "router_lr", "max_grad_norm", "epsilon"):
      if not getattr(self, name) > 0:
        raise ValueError(f"StepConfig.{name} must be > 0, got {getattr(self, name)!r}")
    for name in ("advantage_clip", "min_reward_std", "weight_decay"):
      if getattr(self, name) is not None and getattr(self, name) < 0:
        raise ValueError(f"StepConfig.{name} must be >= 0, got {getattr(self, name)!r}")
    if self.temperature < 0 or self.kl_coef < 0:
      raise ValueError(f"StepConfig: temperature and kl_coef must be >= 0, got "
                       f"{self.temperature!r}, {self.kl_coef!r}")


def make_optimizers(config: StepConfig):
  """(experts optimiser, router optimiser): clip by global norm, then AdamW."""
  make = lambda lr: optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                optax.adamw(lr, weight_decay=config.weight_decay))
  return make(config.expert_lr), make(config.router_lr)


def _micro(tree, k: int):
  """[n, ...] -> [k, n / k, ...] with micro-batch j = rows j, j + k, ...: every device's share of
  a row-sharded batch stays on that device."""
  def split(x):
    return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, tree)


def _expert_grads(backbone, experts, policy: PolicyBatch, advantages, update):
  """Gradient of the policy loss over all rows, accumulated over micro-batches. Each micro-batch
  divides by the whole batch's denominators, so the sum equals the one-pass loss exactly."""
  step_config, config = update.step, update.model
  _, denominator = aggregate_parts(jnp.zeros(policy.loss_mask.shape), policy.loss_mask,
                                   step_config.aggregation, step_config.norm_len)
  trained_tokens = jnp.sum(policy.loss_mask.astype(jnp.float32))
  token_count = trained_tokens
  if policy.denominator is not None:  # rows without signal were left out: the whole batch's
    denominator, token_count = policy.denominator, policy.token_count
  policy = dataclasses.replace(policy, denominator=None, token_count=None)  # not per-row
  kl = step_config.kl_coef > 0
  if step_config.aggregation == "seq-mean-token-sum-norm" and step_config.norm_len is None:
    raise ValueError("train_step: StepConfig.aggregation='seq-mean-token-sum-norm' needs "
                     "StepConfig.norm_len (a constant, e.g. the generation budget); got None")
  if kl and policy.logp_ref is None:
    raise ValueError("train_step: StepConfig.kl_coef > 0 needs PolicyBatch.logp_ref")

  def loss_fn(experts, rows):
    batch, adv = rows
    adapter = update.adapter(experts, batch.routes)
    if batch.shared is None:
      logp, entropy = token_logprobs(backbone, config, adapter, batch.tokens,
                                     batch.attention_mask, step_config.temperature,
                                     step_config.remat, images=batch.images)
    else:
      logp, entropy = shared_token_logprobs(backbone, config, adapter, batch.shared,
                                            step_config.temperature, step_config.remat)
    loss, metrics = policy_loss(
        logp, batch.logp_old, adv, batch.loss_mask, epsilon=step_config.epsilon,
        epsilon_high=step_config.epsilon_high, aggregation=step_config.aggregation,
        kl_coef=step_config.kl_coef, logp_ref=batch.logp_ref if kl else None,
        norm_len=step_config.norm_len, denominator=denominator, token_count=token_count)
    mask = batch.loss_mask.astype(jnp.float32)
    # Over the tokens this update trains on (all of the batch's unless rows were left out).
    metrics["entropy"] = jnp.sum(entropy * mask) / jnp.maximum(trained_tokens, 1.0)
    return loss, metrics

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  k = step_config.micro_batches
  if k > 1 and policy.shared is not None:
    raise ValueError(f"train_step: StepConfig.micro_batches={k} with PolicyBatch.shared: a "
                     "micro-batch would split a packed group; use one or the other")
  if k == 1:
    return grad_fn(experts, (policy, advantages))
  rows = _micro((policy, advantages), k)

  def body(carry, micro):
    out = grad_fn(experts, micro)
    return jax.tree.map(jnp.add, carry, out), None

  zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, experts,
                                                      jax.tree.map(lambda x: x[0], rows)))
  return jax.lax.scan(body, zeros, rows)[0]


# What the update replaces: donated, so that on an accelerator the old and the new train state
# are not both held across the step.
DONATED = ("experts", "router_params", "opt_states")


def train_step(backbone, experts, router_params, opt_states, policy: PolicyBatch,
               router_batch: RouterBatch | None, update_router=True, flat=None, *,
               update, num_routes: int):
  """Returns (experts, router_params, opt_states, metrics). Jitted by `jitted` (update and
  num_routes static; `Update.donate` names the donated arguments); `rl.update.Update` calls it.

  update_router: False leaves the router and its optimiser state as they are (later PPO epochs
  over one rollout; see StepConfig.epochs).

  flat: [num_routes / routes_per_node] bool, the nodes whose rewards are flat
  (`advantages.flat_nodes`, computed once per update by `Update`); None computes it here.

  num_routes: G, the number of global route ids (nodes x routes_per_node). When every advantage
  is 0 (no node carries signal) nothing changes, optimiser moments included, and metrics
  report skipped = 1. Without a router (`update.router` None), pass router_params and
  router_batch None.
  """
  step_config, router_config = update.step, update.router
  routes_per_node = update.routes_per_node
  if num_routes % routes_per_node:
    raise ValueError(f"train_step: num_routes={num_routes} is not a multiple of "
                     f"routes_per_node={routes_per_node}")
  expert_opt, router_opt = make_optimizers(step_config)
  adv = row_advantages(policy.rewards, policy.route, policy.valid,
                       num_nodes=num_routes // routes_per_node, routes_per_node=routes_per_node,
                       estimator=step_config.estimator, clip=step_config.advantage_clip or None,
                       normalize=step_config.normalize_advantages,
                       min_std=step_config.min_reward_std, flat=flat)
  route_adv = adv.route if router_batch is None else adv.route * router_batch.mask
  skip = ~(jnp.any(adv.policy != 0) | jnp.any(route_adv != 0))

  def total_router_loss(router_params):
    logp = router_lib.log_probs(router_params, router_batch.embeddings, router_config)
    route_logp = router_lib.route_log_prob(logp, router_batch.subtask_routes,
                                           router_config.log_prob,
                                           routes_per_node=routes_per_node,
                                           max_resample=router_config.max_resample)
    regs = router_lib.regularisers(router_params, logp, router_config, router_batch.mask)
    loss = router_loss(route_logp, adv.route, step_config.alpha_pi, router_batch.mask)
    mask = router_batch.mask.astype(jnp.float32)
    route_entropy = jnp.sum(entropy_of(logp) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss + sum(regs.values()), {"router_pg_loss": loss, "route_entropy": route_entropy,
                                       **regs}

  def step(_):
    (e_loss, e_metrics), e_grads = _expert_grads(backbone, experts, policy, adv.policy, update)
    e_updates, e_state = expert_opt.update(e_grads, opt_states[0], experts)
    metrics = {"expert_loss": e_loss, "expert_grad_norm": optax.global_norm(e_grads),
               **e_metrics}
    new_router, r_state = router_params, opt_states[1]
    if router_params is not None:
      (r_loss, r_metrics), r_grads = jax.value_and_grad(total_router_loss, has_aux=True)(
          router_params)
      r_updates, r_state = router_opt.update(r_grads, opt_states[1], router_params)
      # A traced flag, so that later PPO epochs reuse this compiled step.
      keep_old = lambda new, old: jax.tree.map(lambda a, b: jnp.where(update_router, a, b),
                                               new, old)
      new_router = keep_old(optax.apply_updates(router_params, r_updates), router_params)
      r_state = keep_old(r_state, opt_states[1])
      metrics.update(router_loss=r_loss, router_grad_norm=optax.global_norm(r_grads),
                     **r_metrics)
    return optax.apply_updates(experts, e_updates), new_router, (e_state, r_state), metrics

  def keep(_):
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(step, None)[3])
    return experts, router_params, opt_states, zeros

  experts, router_params, opt_states, metrics = jax.lax.cond(skip, keep, step, None)
  metrics.update(skipped=skip.astype(jnp.float32),
                 skipped_nodes=jnp.sum(adv.node_skipped.astype(jnp.float32)),
                 advantage_abs_mean=jnp.sum(jnp.abs(adv.policy) * policy.valid)
                 / jnp.maximum(jnp.sum(policy.valid), 1))
  return experts, router_params, opt_states, metrics


# Config fields that do not change an update's result: remat recomputes the same layers,
# micro_batches splits the rows under one denominator (test_micro_batches_equal_one_pass),
# RolloutConfig.engine samples the static path's rows on the engine. A run's identity leaves
# them out (`rl.run.record`), so a run the OOM killer stopped can resume with layers recomputed
# or its rows split.
EXECUTION_ONLY = ("micro_batches", "remat", "engine")


@functools.cache
def jitted(donate: tuple[str, ...] = DONATED):
  """`train_step` jitted with the arguments in `donate` donated."""
  return jax.jit(train_step, static_argnames=("update", "num_routes"), donate_argnames=donate)


def init_opt_states(experts, router_params, step_config: StepConfig):
  expert_opt, router_opt = make_optimizers(step_config)
  router_state = None if router_params is None else router_opt.init(router_params)
  return expert_opt.init(experts), router_state
