"""The MoRSE training loop around the jitted step: draw routes, roll out B x M rows per node,
score them, update, log, checkpoint.

A `Trainer` does one update (`step`) for a batch of nodes with a caller-supplied reward function,
so the DAG runner can drive it node by node. A node may carry a `MergeCall`: its Merger is then
sampled once per executor row, before the executors, and its rows join the same update. `fit` is
the plain loop over a data source whose items are a pure function of their index (the cursor in
`TrainState`): a run resumed from a checkpoint draws the same nodes, routes and samples as one
that was never stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import llm
from morse_jax.lora import router as router_lib
from morse_jax.lora.experts import LoraConfig, init_experts, shard_experts
from morse_jax.rl import loop
from morse_jax.rl.engine_sampler import EngineSampler
from morse_jax.rl import metrics as metrics_lib
from morse_jax.rl import rollout as rollout_lib
from morse_jax.rl import run as run_lib
from morse_jax.rl import train_step as ts
from morse_jax.rl import update as update_lib
from morse_jax.rl.logprobs import scoring_temperature
from morse_jax.checkpoint.steps import Checkpoints
from morse_jax.rl.state import TrainState


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  routes_per_node: int = 4  # B
  group_size: int = 4  # M
  max_new_tokens: int = 256
  sampling: llm.SamplingConfig = llm.SamplingConfig(temperature=1.0)
  kernel: str = "auto"  # mixture kernel while sampling
  train_kernel: str = "gather"  # mixture kernel in the update (differentiated)
  # The update runs each route's common prompt once (compaction.share_prefixes); only with
  # StepConfig.micro_batches == 1, else rows run as they are.
  share_prompts: bool = True
  # The rows on the generation engine (`rl.engine_sampler`: no row waits for the wave's
  # longest; the same tokens and log-probs), on one device; a mesh keeps the static sampler.
  engine: bool = False

  def __post_init__(self):
    for name in ("routes_per_node", "group_size", "max_new_tokens"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"RolloutConfig.{name} must be an int >= 1, got "
                         f"{getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class MergeCall:
  """A node's Merger call, trained with its Executor: sampled once per executor row.

  Row j = b * M + m of the node first samples the merge with experts ["merge"] + routes[b]; the
  executor row j then runs `executor_prompt(j, merge tokens)` (the merge text as its context).
  The merge row takes the reward of executor row j and the route id of a node of its own
  with the same B x M layout, so both rows of a pair get the same advantage (within-route
  under HGRPO, node-wide under GRPO) and the router gets nothing from the merge (mas.runner
  says why).
  """

  prompt: Sequence[int]
  routes: Sequence[Sequence[int]]  # B lists of 0-based subtask experts (from the parents')
  executor_prompt: Callable[[int, np.ndarray], Sequence[int]]


@dataclasses.dataclass(frozen=True)
class TrainNode:
  """A node to train on. Routed nodes carry the router input; others carry fixed experts. With
  `merge`, each executor row's prompt comes from the merge and `prompt` is not used."""

  prompt: Sequence[int] = ()
  role: str = "execute"
  embedding: np.ndarray | None = None  # [D] router input
  experts: Sequence[int] | None = None  # fixed 0-based subtask experts (no router)
  merge: MergeCall | None = None


RewardFn = Callable[[rollout_lib.GroupRollout], np.ndarray]


class Source(Protocol):
  def batch(self, cursor: int, count: int) -> tuple[list[TrainNode], RewardFn]: ...


@functools.partial(jax.jit, static_argnames=("config",))
def _router_log_probs(params, emb, config):
  return router_lib.log_probs(params, emb, config)


class Trainer:
  """Holds the frozen backbone (an `llm.Model`, whose stop ids end a sample and whose pad id pads
  the rows) and the static settings; the changing part is a `TrainState`."""

  def __init__(self, model: llm.Model, lora: LoraConfig, router: router_lib.RouterConfig | None,
               step: ts.StepConfig, rollout: RolloutConfig, *, embed_dim: int, mesh=None):
    self.model, self.lora, self.router = model, lora, router
    # The update scores tokens at the temperature they were sampled at.
    step = dataclasses.replace(step, temperature=scoring_temperature(rollout.sampling))
    if step.aggregation == "seq-mean-token-sum-norm" and step.norm_len is None:
      step = dataclasses.replace(step, norm_len=rollout.max_new_tokens)
    self.rollout_config, self.embed_dim, self.mesh = rollout, embed_dim, mesh
    self.generation = llm.GenerationSettings.for_model(model, rollout.max_new_tokens,
                                                       rollout.sampling)
    on_engine = rollout.engine and (mesh is None or mesh.size == 1)
    self.sampler = EngineSampler(model) if on_engine else None
    data = 1 if mesh is None else mesh.shape["data"]
    self.update = update_lib.Update(
        model.config, lora, step, router, kernel=rollout.train_kernel,
        routes_per_node=rollout.routes_per_node, rows_multiple=math.lcm(data, step.micro_batches),
        share_prompts=rollout.share_prompts)

  @property
  def step_config(self) -> ts.StepConfig:
    return self.update.step

  @property
  def rows_multiple(self) -> int:
    return self.update.rows_multiple

  def init_state(self, key: jax.Array) -> TrainState:
    k_experts, k_router, k_run = jax.random.split(key, 3)
    experts = init_experts(self.lora, self.model.config, k_experts)
    router = None if self.router is None else router_lib.init_router(
        self.router, self.embed_dim, self.lora.num_subtask_experts, k_router)
    if self.mesh is not None:  # laid out by their declared logical axes, as the backbone is
      experts = shard_experts(experts, self.mesh)
      router = None if router is None else router_lib.shard_router(router, self.mesh)
    return TrainState(step=jnp.int32(0), experts=experts, router=router,
                      opt_states=self.update.init_opt_states(experts, router),
                      rng=k_run, cursor=jnp.int32(0))

  def metadata(self) -> dict:
    """What every checkpoint step of this trainer records and is compared on (`run.record`)."""
    return run_lib.record(model=self.model.config, lora=self.lora, router=self.router,
                          step=self.step_config, rollout=self.rollout_config,
                          embed_dim=self.embed_dim)

  def requests(self, key, router_params, nodes: Sequence[TrainNode]):
    """NodeRequests with B routes per node (distinct where possible), and the router's
    log-probs of the routed nodes."""
    b = self.rollout_config.routes_per_node
    routed = [i for i, n in enumerate(nodes) if n.experts is None]
    logp = np.zeros((0, self.lora.num_subtask_experts), np.float32)
    if routed and self.router is None:
      raise ValueError(f"Trainer: node {routed[0]} has no fixed experts and there is no router "
                       "(a fixed mixture needs TrainNode.experts)")
    if routed:
      for i in routed:
        if nodes[i].embedding is None:
          raise ValueError(f"Trainer: node {i} has neither an embedding nor fixed experts")
      emb = np.stack([np.asarray(nodes[i].embedding, np.float32) for i in routed])
      logp = np.asarray(_router_log_probs(router_params, emb, self.router))
    out, keys = [], jax.random.split(key, len(nodes))
    for i, node in enumerate(nodes):
      if node.merge is None and not len(node.prompt):
        raise ValueError(f"Trainer: node {i} has an empty prompt and no merge")
      if node.experts is not None:
        routes = [list(node.experts)] * b
      else:
        routes = router_lib.distinct_routes(keys[i], logp[routed.index(i)], b, self.router.top_k,
                                            self.router.max_resample).tolist()
      out.append(rollout_lib.NodeRequest(node.prompt, node.role, routes,
                                         routed=node.experts is None, embedding=node.embedding))
    return out, logp

  def _sample(self, experts, requests, key) -> rollout_lib.GroupRollout:
    rc = self.rollout_config
    return rollout_lib.rollout(
        self.model, experts, self.lora, requests, self.generation, group_size=rc.group_size,
        rng=key, kl=self.step_config.kl_coef > 0, rows_multiple=self.rows_multiple,
        mesh=self.mesh, kernel=rc.kernel, sampler=self.sampler)

  def _merges(self, experts, nodes: Sequence[TrainNode], requests, key):
    """Samples every MergeCall once per executor row. Returns (the merge rollout, the executor
    row each merge row is paired with, the requests with those rows' prompts)."""
    per_node = self.rollout_config.routes_per_node * self.rollout_config.group_size
    merging = [i for i, n in enumerate(nodes) if n.merge is not None]
    for i in merging:
      if len(nodes[i].merge.routes) != self.rollout_config.routes_per_node:
        raise ValueError(f"Trainer: node {i} has a merge with {len(nodes[i].merge.routes)} "
                         f"routes, routes_per_node is {self.rollout_config.routes_per_node}")
    merged = self._sample(experts, [
        rollout_lib.NodeRequest(nodes[i].merge.prompt, "merge",
                                [list(r) for r in nodes[i].merge.routes], routed=False)
        for i in merging], key)
    requests, paired = list(requests), []
    for k, i in enumerate(merging):
      prompts = [nodes[i].merge.executor_prompt(j, merged.completions[k * per_node + j])
                 for j in range(per_node)]
      requests[i] = dataclasses.replace(requests[i], row_prompts=prompts)
      paired.extend(range(i * per_node, (i + 1) * per_node))
    return merged, np.asarray(paired, np.int64), requests

  def step(self, state: TrainState, nodes: Sequence[TrainNode], reward_fn: RewardFn):
    """One update on `nodes`: returns (state, metrics, rollout). state.cursor is left alone.

    `reward_fn` and the returned rollout see the executor rows only; merge rows (nodes with a
    MergeCall) join the update after them."""
    t0 = time.perf_counter()
    rng, k_route, k_sample = jax.random.split(state.rng, 3)
    requests, _ = self.requests(k_route, state.router, nodes)
    rc = self.rollout_config
    merged = None
    if any(n.merge is not None for n in nodes):
      merged, paired, requests = self._merges(state.experts, nodes, requests,
                                              jax.random.fold_in(k_sample, 1))
    out = self._sample(state.experts, requests, k_sample)
    t1 = time.perf_counter()
    rewards = np.asarray(reward_fn(out), np.float32)
    t2 = time.perf_counter()
    update, update_rewards = out, rewards
    if merged is not None:
      update = rollout_lib.concat(out, merged, pad_id=self.model.pad_id,
                                  rows_multiple=self.rows_multiple)
      update_rewards = np.concatenate([rewards, rewards[paired]])
    batch = rollout_lib.policy_batch(update, update_rewards)
    rbatch = None if self.router is None else rollout_lib.router_batch(update, self.router.top_k,
                                                                        self.embed_dim)
    # Flat nodes add nothing: update on the others' rows, each route's prompt run once. Rows
    # with prompts of their own (after a merge) have longer suffixes than the generation budget.
    # The state's experts, router and optimiser state are donated to the update.
    experts, router, opt_states, step_metrics, info = self.update(
        self.model.params, state.experts, state.router, state.opt_states, batch, rbatch,
        num_routes=update.num_routes,
        width=None if merged is not None else llm.length_bucket(rc.max_new_tokens),
        mesh=self.mesh)
    t3 = time.perf_counter()
    node_of_row = np.asarray([out.node_of_row(r) for r in range(out.num_rows)])
    metrics = {k: float(v) for k, v in step_metrics.items()}
    metrics.update(metrics_lib.reward_stats(rewards, node_of_row, self.step_config.min_reward_std,
                                            flat=info.flat[:len(nodes)]))
    metrics["expert_usage"] = metrics_lib.expert_usage(update.expert_sets, self.lora.num_experts)
    metrics["merge_rows"] = 0 if merged is None else merged.num_rows
    metrics["generated_tokens"] = update.generated_tokens()
    metrics["tokens_per_s"] = metrics_lib.tokens_per_second(update.generated_tokens(), t1 - t0)
    metrics["time_rollout_s"], metrics["time_reward_s"] = t1 - t0, t2 - t1
    metrics["time_update_s"] = t3 - t2
    metrics["update_rows"] = info.compacted.kept_rows
    metrics["update_tokens"] = float(np.prod(info.shape))
    state = dataclasses.replace(state, step=state.step + 1, experts=experts, router=router,
                                opt_states=opt_states, rng=rng)
    return state, metrics, out


TIMING_KEYS = ("tokens_per_s", "time_rollout_s", "time_reward_s", "time_update_s")


def fit(trainer: Trainer, state: TrainState, source: Source, *, steps: int,
        nodes_per_step: int, checkpoints: Checkpoints | None = None,
        writer: metrics_lib.MetricsWriter | None = None) -> TrainState:
  """Runs updates until state.step == steps, checkpointing and logging after each
  (`loop.run_loop`, which closes the writer at the end)."""
  def step_fn(state):
    cursor = int(state.cursor)
    nodes, reward_fn = source.batch(cursor, nodes_per_step)
    state, metrics, _ = trainer.step(state, nodes, reward_fn)
    return dataclasses.replace(state, cursor=jnp.int32(cursor + len(nodes))), metrics

  return loop.run_loop(step_fn, state, steps=steps, writer=writer, checkpoints=checkpoints)

