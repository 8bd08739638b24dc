"""B x M group rollouts: every row of every node in one sampler call, packed for the update.

For node i with B routes and M candidates per route, row (i * B + b) * M + m runs the node's
prompt (or its own row prompt) with experts [role expert] + route b's subtask experts (uniform
weights). Rows are packed right-padded as prompt | completion (or any list of segments: prompt,
generated text, tool output, ...); only generated segments have loss_mask 1. `concat` joins two
rollouts with the same B and M into one update batch (a wave's merge calls and its executors).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import llm
from morse_jax.llm.sampling import bucket
from morse_jax.lora.experts import LoraConfig, make_adapter
from morse_jax.lora.mixture import Routes, uniform_routes
from morse_jax.rl import batch as batch_lib
from morse_jax.rl import logprobs
# Segment, Packed, pack, padded_rows and sequence_logprobs are re-exported: they live in rl.batch
# and rl.logprobs.
from morse_jax.rl.batch import (Packed, PolicyBatch, RouterBatch, Segment, pack,  # noqa: F401
                                padded_rows)
from morse_jax.rl.logprobs import sequence_logprobs  # noqa: F401


@dataclasses.dataclass(frozen=True)
class NodeRequest:
  """One DAG node to roll out."""

  prompt: Sequence[int]  # token ids, chat template applied
  role: str  # the role expert ("execute", "merge")
  routes: Sequence[Sequence[int]]  # B routes of 0-based subtask-expert ids
  routed: bool = True  # False: inherited experts (merge node), no router loss
  embedding: np.ndarray | None = None  # [D] router input, needed when routed
  # B * M prompts, one per row in row order, when a node's candidates see different prompts
  # (the executor rows of a merge node, each after its own merge sample); None: `prompt`.
  row_prompts: Sequence[Sequence[int]] | None = None


@dataclasses.dataclass
class GroupRollout:
  """The sampled rows of a batch of nodes, packed and padded for `PolicyBatch`."""

  requests: list[NodeRequest]
  routes_per_node: int  # B
  group_size: int  # M
  num_nodes: int  # nodes after padding to a power of two (static shapes)
  completions: list[np.ndarray]  # per real row, the generated tokens (EOS included)
  expert_sets: list[list[int]]  # per real row
  packed: Packed  # [rows, T], rows = real rows padded
  route: np.ndarray  # [rows] global route id (0 on padding rows)
  valid: np.ndarray  # [rows]
  routes: Routes
  logp_ref: np.ndarray | None  # [rows, T] adapters off, when the KL is on

  @property
  def num_rows(self) -> int:
    return len(self.completions)

  @property
  def num_routes(self) -> int:
    return self.num_nodes * self.routes_per_node

  def node_of_row(self, row: int) -> int:
    return row // (self.routes_per_node * self.group_size)

  def generated_tokens(self) -> int:
    return int(sum(len(c) for c in self.completions))


def expert_sets_of(requests: Sequence[NodeRequest], lora: LoraConfig, group_size: int):
  """Per row, [role expert] + the route's subtask experts."""
  sets = []
  for i, req in enumerate(requests):
    for b, route in enumerate(req.routes):
      experts = [lora.role_index(req.role)] + [lora.subtask_index(int(j)) for j in route]
      experts = lora.check_route(experts, f"node {i} route {b}")
      sets.extend([experts] * group_size)
  return sets


def rollout(model: llm.Model, experts, lora: LoraConfig, requests: Sequence[NodeRequest],
            settings: llm.GenerationSettings, *, group_size: int, rng: jax.Array,
            kl: bool = False, rows_multiple: int = 1, mesh=None,
            kernel: str = "auto", sampler=None) -> GroupRollout:
  """Samples M candidates for each of the B routes of every node, in one sampler call.

  settings: the sampler's (its prompt_repeats is the rollout's to choose: M, unless some rows
  have prompts of their own); its pad_id also pads the packed rows. Log-probs under the sampling
  distribution are recorded as the old policy's. When top-k or top-p filtering is on, that
  distribution is not the policy's softmax, so they are recomputed with one forward pass.
  kl=True also records the adapters-off (reference) log-probs. Rows are padded to a power of two
  that is a multiple of `rows_multiple` (mesh data axis x micro-batches); kernel: the mixture
  kernel while sampling; sampler: `llm.sample` (None) or a call with its signature and results
  (`rl.engine_sampler.EngineSampler`: the rows on the generation engine).
  """
  if not requests:
    raise ValueError("rollout: no nodes")
  b = len(requests[0].routes)
  for i, req in enumerate(requests):
    if len(req.routes) != b:
      raise ValueError(f"rollout: node {i} has {len(req.routes)} routes, node 0 has {b}")
    if req.routed and req.embedding is None:
      raise ValueError(f"rollout: node {i} is routed but has no router embedding")
    if req.row_prompts is not None and len(req.row_prompts) != b * group_size:
      raise ValueError(f"rollout: node {i} has {len(req.row_prompts)} row_prompts, expected "
                       f"B * M = {b * group_size}")
  sets = expert_sets_of(requests, lora, group_size)
  prompts = [list(p) for req in requests
             for p in (req.row_prompts or [req.prompt] * (b * group_size))]
  # A route's M candidates share one prefill, unless some rows have prompts of their own.
  repeats = 1 if any(req.row_prompts is not None for req in requests) else group_size
  adapter = make_adapter(experts, lora, model.config, sets, kernel=kernel)
  out = (sampler or llm.sample)(model, prompts, dataclasses.replace(settings,
                                                                    prompt_repeats=repeats),
                                rng=rng, mesh=mesh, adapter=adapter)
  n = len(prompts)
  completions = [out.tokens[r, :out.lengths[r]] for r in range(n)]
  segments = [[Segment(prompts[r]), Segment(completions[r], out.logprobs[r, :out.lengths[r]])]
              for r in range(n)]
  # T fits the longest real row, not the longest prompt plus max_new_tokens: completions are
  # mostly far shorter than the cap, and the update's cost grows with T squared.
  rows = batch_lib.layout(segments, np.arange(n) // group_size, sets, pad_id=settings.pad_id,
                          rows_multiple=rows_multiple, width=adapter.routes.idx.shape[1])
  packed = rows.packed
  sampling = settings.sampling
  temperature = logprobs.scoring_temperature(sampling)
  recompute = lambda adapter: np.asarray(logprobs.recompute(
      model.params, model.config, adapter, packed.tokens, packed.attention_mask,
      packed.loss_mask, temperature))
  if not sampling.greedy and (sampling.top_p < 1.0 or sampling.top_k):
    # the same mixtures, padding rows too
    packed.logp_old = recompute(dataclasses.replace(adapter, routes=rows.routes))
  logp_ref = recompute(None) if kl else None
  return GroupRollout(requests=list(requests), routes_per_node=b, group_size=group_size,
                      num_nodes=bucket(len(requests), minimum=1), completions=completions,
                      expert_sets=sets, packed=packed, route=rows.route, valid=rows.valid,
                      routes=rows.routes, logp_ref=logp_ref)


def concat(first: GroupRollout, second: GroupRollout, *, pad_id: int = 0,
           rows_multiple: int = 1) -> GroupRollout:
  """first's nodes, then second's, as one rollout: one update over both (same B and M).

  Node i of `second` becomes node len(first.requests) + i, so its route ids follow first's
  real nodes; rows are padded again (a power of two, a multiple of rows_multiple), T to the
  longer of the two.
  """
  if (first.routes_per_node, first.group_size) != (second.routes_per_node, second.group_size):
    raise ValueError(f"concat: B x M differ: {first.routes_per_node} x {first.group_size} vs "
                     f"{second.routes_per_node} x {second.group_size}")
  if (first.logp_ref is None) != (second.logp_ref is None):
    raise ValueError("concat: one rollout has logp_ref (kl) and the other has not")
  n1, n2 = first.num_rows, second.num_rows
  n = n1 + n2
  rows = padded_rows(n, rows_multiple)
  t = max(first.packed.tokens.shape[1], second.packed.tokens.shape[1])

  def join(a, b, fill, dtype):  # [rows, t]: first's real rows, second's, then padding rows
    out = np.full((rows, t), fill, dtype)
    out[:n1, :a.shape[1]] = a[:n1]
    out[n1:n, :b.shape[1]] = b[:n2]
    return out

  p, q = first.packed, second.packed
  packed = Packed(join(p.tokens, q.tokens, pad_id, np.int32),
                  join(p.attention_mask, q.attention_mask, 0, np.int32),
                  join(p.loss_mask, q.loss_mask, 0, np.float32),
                  join(p.logp_old, q.logp_old, 0, np.float32))
  packed.attention_mask[n:, 0] = 1  # padding rows as `rollout` makes them: one pad token
  logp_ref = None
  if first.logp_ref is not None:
    logp_ref = join(first.logp_ref, second.logp_ref, 0, np.float32)
  sets = first.expert_sets + second.expert_sets
  requests = first.requests + second.requests
  return GroupRollout(requests=requests, routes_per_node=first.routes_per_node,
                      group_size=first.group_size, num_nodes=bucket(len(requests), minimum=1),
                      completions=first.completions + second.completions, expert_sets=sets,
                      packed=packed,
                      route=np.where(np.arange(rows) < n, np.arange(rows) // first.group_size,
                                     0).astype(np.int32),
                      valid=(np.arange(rows) < n).astype(np.float32),
                      routes=uniform_routes(sets + [sets[0]] * (rows - n)), logp_ref=logp_ref)


def policy_batch(rollout: GroupRollout, rewards: Sequence[float]) -> PolicyBatch:
  """The update's rows: rewards [real rows] (one per completion, in row order)."""
  rows = batch_lib.Layout(rollout.packed, rollout.route, rollout.valid, rollout.routes)
  return batch_lib.policy_batch(rows, rewards, rollout.logp_ref)


def router_batch(rollout: GroupRollout, top_k: int, input_dim: int) -> RouterBatch:
  """One entry per global route; merge nodes and padding nodes get mask 0."""
  g = rollout.num_routes
  emb = np.zeros((g, input_dim), np.float32)
  draws = np.zeros((g, top_k), np.int32)
  mask = np.zeros(g, np.float32)
  for i, req in enumerate(rollout.requests):
    if not req.routed:
      continue
    for b, route in enumerate(req.routes):
      if len(route) != top_k:
        raise ValueError(f"router_batch: node {i} route {b} has {len(route)} experts, "
                         f"top_k is {top_k}")
      j = i * rollout.routes_per_node + b
      emb[j], draws[j], mask[j] = req.embedding, route, 1.0
  return RouterBatch(embeddings=jnp.asarray(emb), subtask_routes=jnp.asarray(draws),
                     mask=jnp.asarray(mask))
