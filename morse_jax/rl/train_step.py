"""One jitted HGRPO (or GRPO) update of the experts and the router; the backbone stays frozen.

The experts learn only from the clipped-surrogate loss on generated tokens (advantages `within`,
or GRPO's shared advantage); the router learns only from its cross-route loss plus regularisers.
They are separate parameter trees with separate AdamW optimisers, so neither gets the other's
gradient.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from morse_jax.llm.config import LlmConfig
from morse_jax.llm.model import forward
from morse_jax.lora import router as router_lib
from morse_jax.lora.mixture import Adapter, Routes
from morse_jax.rl.losses import policy_loss, router_loss


@dataclasses.dataclass(frozen=True)
class StepConfig:
  expert_lr: float = 8e-5
  router_lr: float = 3e-5
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  epsilon: float = 0.2
  epsilon_high: float | None = None
  aggregation: str = "token-mean"
  alpha_pi: float = 0.15
  kl_coef: float = 0.0


def make_optimizers(config: StepConfig):
  """(experts optimiser, router optimiser): clip by global norm, then AdamW."""
  make = lambda lr: optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                optax.adamw(lr, weight_decay=config.weight_decay))
  return make(config.expert_lr), make(config.router_lr)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PolicyBatch:
  """Rows = sampled candidates. Token arrays are [n, T]; `loss_mask` is 1 on generated tokens."""

  tokens: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array
  logp_old: jax.Array  # [n, T]: log-prob of tokens[:, t] when sampled (0 where loss_mask is 0)
  advantages: jax.Array  # [n]: A_within (HGRPO) or the shared GRPO advantage
  routes: Routes  # [n, e] each row's experts


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RouterBatch:
  """One entry per sampled route of a routed node (merge nodes, with log-prob 0, are left out)."""

  embeddings: jax.Array  # [B, D]
  subtask_routes: jax.Array  # [B, K] ordered subtask-expert draws (0-based subtask ids)
  advantages: jax.Array  # [B]: A_cross (HGRPO) or the mean GRPO advantage of the route


def token_logprobs(params, config: LlmConfig, adapter: Adapter, tokens, attention_mask):
  """[n, T] log p(tokens[:, t] | tokens[:, :t]) under the adapted model (0 at t = 0)."""
  logits, _ = forward(params, config, tokens, attention_mask=attention_mask, adapter=adapter)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)


@functools.partial(jax.jit, static_argnames=("config", "router_config", "step_config", "layers",
                                             "scale", "kernel"))
def train_step(backbone, experts, router_params, opt_states, policy: PolicyBatch,
               router_batch: RouterBatch, *, config: LlmConfig,
               router_config: router_lib.RouterConfig, step_config: StepConfig,
               layers: tuple[int, ...], scale: float, kernel: str = "dense"):
  """Returns (experts, router_params, opt_states, metrics)."""
  expert_opt, router_opt = make_optimizers(step_config)

  def expert_loss(experts):
    adapter = Adapter(experts=experts, routes=policy.routes, layers=layers, scale=scale,
                      kernel=kernel)
    logp = token_logprobs(backbone, config, adapter, policy.tokens, policy.attention_mask)
    logp_ref = None
    if step_config.kl_coef:
      logp_ref = token_logprobs(backbone, config, None, policy.tokens, policy.attention_mask)
    return policy_loss(logp, policy.logp_old, policy.advantages, policy.loss_mask,
                       epsilon=step_config.epsilon, epsilon_high=step_config.epsilon_high,
                       aggregation=step_config.aggregation, kl_coef=step_config.kl_coef,
                       logp_ref=logp_ref)

  def total_router_loss(router_params):
    logp = router_lib.log_probs(router_params, router_batch.embeddings, router_config)
    route_logp = router_lib.route_log_prob(logp, router_batch.subtask_routes,
                                           router_config.log_prob)
    regs = router_lib.regularisers(router_params, logp, router_config)
    loss = router_loss(route_logp, router_batch.advantages, step_config.alpha_pi)
    return loss + sum(regs.values()), {"router_pg_loss": loss, **regs}

  (e_loss, e_metrics), e_grads = jax.value_and_grad(expert_loss, has_aux=True)(experts)
  (r_loss, r_metrics), r_grads = jax.value_and_grad(total_router_loss, has_aux=True)(
      router_params)
  e_updates, e_state = expert_opt.update(e_grads, opt_states[0], experts)
  r_updates, r_state = router_opt.update(r_grads, opt_states[1], router_params)
  metrics = {"expert_loss": e_loss, "router_loss": r_loss,
             "expert_grad_norm": optax.global_norm(e_grads),
             "router_grad_norm": optax.global_norm(r_grads), **e_metrics, **r_metrics}
  return (optax.apply_updates(experts, e_updates), optax.apply_updates(router_params, r_updates),
          (e_state, r_state), metrics)


def init_opt_states(experts, router_params, step_config: StepConfig):
  expert_opt, router_opt = make_optimizers(step_config)
  return expert_opt.init(experts), router_opt.init(router_params)
