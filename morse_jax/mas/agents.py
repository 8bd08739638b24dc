"""The agents' shared engine: chat prompts -> token ids -> one batched sampler call -> text.

Every call carries its own mixture of experts (role expert plus subtask experts) or none (the
planner uses the frozen backbone). The experts and the router are passed in, not held, so the
training loop can run the agents with the current `TrainState`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from morse_jax import llm
from morse_jax.lora import router as router_lib
from morse_jax.lora.experts import LoraConfig, make_adapter
from morse_jax.mas.graph import Subtask


@dataclasses.dataclass(frozen=True)
class Reply:
  text: str
  tokens: int  # generated tokens, a final stop token included
  cut: bool  # ended by the token limit, not by a stop token


@dataclasses.dataclass
class Agents:
  model: llm.Model
  lora: LoraConfig | None  # None: the bare backbone (the single-agent baseline)
  router: router_lib.RouterConfig | None  # None: a fixed mixture (role experts only)
  embed: Callable[[Sequence[str]], np.ndarray] | None  # frozen router input
  max_new_tokens: int = 512
  kernel: str = "auto"
  mesh: object = None
  # `llm.sample` (None) or a call with its signature: a trainer's `EngineSampler`, so that the
  # training waves' merge calls run on the rollouts' engine.
  sampler: Callable | None = None

  def tokens(self, messages: list[dict]) -> list[int]:
    return self.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

  def embeddings(self, subtasks: Sequence[Subtask]) -> np.ndarray | None:
    if self.embed is None:
      return None
    return np.asarray(self.embed([router_lib.subtask_text(s.title, s.description)
                                  for s in subtasks]), np.float32)

  def greedy_routes(self, router_params, subtasks: Sequence[Subtask]) -> list[list[int]]:
    """Inference routing: the K most probable subtask experts of each subtask (0-based)."""
    if self.router is None:
      return [[] for _ in subtasks]
    if not subtasks:
      return []
    logp = router_lib.log_probs(router_params, self.embeddings(subtasks), self.router)
    return np.asarray(router_lib.greedy_routes(logp, self.router.top_k)).tolist()

  def expert_set(self, role: str, subtask_experts: Sequence[int]) -> list[int] | None:
    if self.lora is None:
      return None
    return [self.lora.role_index(role)] + [self.lora.subtask_index(int(j))
                                           for j in subtask_experts]

  def generate(self, prompts: Sequence[list[int]], expert_sets: Sequence[list[int]] | None,
               experts=None, *, rng: jax.Array,
               sampling: llm.SamplingConfig = llm.GREEDY,
               max_new_tokens: int | None = None) -> list[str]:
    """One sampler call over all prompts; expert_sets None runs the bare backbone."""
    return [r.text for r in self.replies(prompts, expert_sets, experts, rng=rng,
                                         sampling=sampling, max_new_tokens=max_new_tokens)]

  def replies(self, prompts: Sequence[list[int]], expert_sets: Sequence[list[int]] | None,
              experts=None, *, rng: jax.Array, sampling: llm.SamplingConfig = llm.GREEDY,
              max_new_tokens: int | None = None, row_keys=None) -> list[Reply]:
    """`generate` with what the sampler also reports: tokens generated and whether the token
    limit, not a stop token, ended the reply. row_keys: each row's own key (`llm.sample`)."""
    if not prompts:
      return []
    adapter = None
    if expert_sets is not None and self.lora is not None:
      adapter = make_adapter(experts, self.lora, self.model.config, expert_sets, self.kernel)
    limit = max_new_tokens or self.max_new_tokens
    settings = llm.GenerationSettings.for_model(self.model, limit, sampling)
    out = (self.sampler or llm.sample)(self.model, list(prompts), settings, rng=rng,
                                       mesh=self.mesh, adapter=adapter, row_keys=row_keys)
    return [self.reply(out.tokens[i, :int(out.lengths[i])], limit) for i in range(len(prompts))]

  def reply(self, tokens, limit: int) -> Reply:
    """A row's generated tokens (a final stop included) as a `Reply` under a limit of `limit`."""
    n = len(tokens)
    cut = n >= limit and int(tokens[n - 1]) not in {int(t) for t in self.model.stop_ids}
    return Reply(self.decode(tokens), n, cut)

  def decode(self, ids) -> str:
    return self.model.tokenizer.decode([int(t) for t in ids], skip_special_tokens=True)
