"""The agents' sampler: chat prompts (token ids) of one module -> generated tokens, their sampling
log-probs and text, in ONE sampler call per `generate`.

Two backends behind one protocol:
- `AdapterGenerator`: the three APEx modules are three role experts on one frozen backbone
  (`LoraConfig(roles=("planner", "executor", "distiller"), num_subtask_experts=0)`); every row of a
  call runs with expert set [role_index(module)] (the `merged` kernel: one route per call).
- `SeparateGenerator`: one backbone per module, each with its own experts (or none).
Log-probs are those of the distribution each token was drawn from, as `rollout()` records them;
when top-k / top-p filter, the trainer recomputes them (see morse_jax.rl.rollout).

With `engines` (`apex_jax.agents.engines`, issue 55) both run their rows on one generation engine
per backbone instead of the static sampler, row i of a `generate` still drawing with
fold_in(rng, i); `submit` / `step` let the executor advance each episode on its own.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import llm
from morse_jax.lora.experts import LoraConfig, make_adapter

from apex_jax.agents import engines as engines_lib
from apex_jax.agents.trajectory import MODULES

APEX_ROLES = ("planner", "executor", "distiller")


@dataclasses.dataclass
class Generation:
  tokens: np.ndarray  # [n] int32, generated ids, EOS included when one was emitted
  logprobs: np.ndarray  # [n] float32, sampling log-probs of `tokens`
  text: str  # decoded without special tokens
  finished: bool = True  # False: the row hit max_new_tokens without an EOS (truncated)


class ChatTokenizer(Protocol):
  """`morse_jax.llm.Tokenizer`: message content and encoded text never become control tokens."""

  pad_id: int

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                          **kwargs) -> list[int]: ...

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class Generator(Protocol):
  """What the agents need: tokenizers and one batched sampler call per module.

  `tokenizer` is the chat tokenizer (messages -> ids, see `chat_tokens`); `tokenizer_of(module)`
  the one of a module's backbone (they differ only with separate backbones)."""

  tokenizer: ChatTokenizer

  def tokenizer_of(self, module: str) -> ChatTokenizer: ...

  def generate(self, module: str, prompts: Sequence[list[int]], *, rng: jax.Array,
               max_new_tokens: int, sampling: llm.SamplingConfig) -> list[Generation]: ...

  # A generator whose backbone sees images (`vl_generator.VlGenerator`) sets `takes_images`; its
  # `generate` takes `images=` (per prompt its uint8 images, one per image block) and its
  # tokenizer's `apply_chat_template` `images=` (how many markers are images).


def takes_images(generator) -> bool:
  return bool(getattr(generator, "takes_images", False))


def with_experts(generator, experts):
  """`generator` sampling with `experts`: a copy holding them (the caller's generator is left as
  it is), for any generator with an `experts` attribute (AdapterGenerator, test fakes); one
  without is returned as it is (SeparateGenerator holds its experts per module)."""
  if not hasattr(generator, "experts"):
    return generator
  if dataclasses.is_dataclass(generator):
    return dataclasses.replace(generator, experts=experts)
  out = copy.copy(generator)  # shallow: a fake's records stay shared with the original
  out.experts = experts
  return out


def chat_tokens(tokenizer: ChatTokenizer, messages: list[dict]) -> list[int]:
  """Chat messages -> prompt ids with the assistant turn opened (as mas.agents.Agents.tokens)."""
  return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def check_module(module: str) -> None:
  if module not in MODULES:
    raise ValueError(f"module {module!r} not in {MODULES}")


def check_roles(lora: LoraConfig, owner: str) -> None:
  missing = [m for m in MODULES if m not in lora.roles]
  if missing:
    raise ValueError(f"{owner}: LoraConfig.roles {lora.roles!r} lacks the module role(s) "
                     f"{missing}")


def _generation(model: llm.Model, tokens, logprobs) -> Generation:
  """A row's tokens and log-probs as a Generation (finished: it ends with a stop id)."""
  tokens = np.asarray(tokens, np.int32)
  stops = set(int(s) for s in model.stop_ids)
  return Generation(tokens, np.asarray(logprobs, np.float32),
                    model.tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True),
                    finished=bool(len(tokens) and int(tokens[-1]) in stops))


def generations(model, n: int, out) -> list[Generation]:
  """The first n rows of a sampler's output (`SampleOutput`) as Generations, decoded with the
  model's tokenizer; finished when the row ends at one of its stop ids."""
  return [_generation(model, out.tokens[i, :int(out.lengths[i])],
                      out.logprobs[i, :int(out.lengths[i])]) for i in range(n)]


def _check_tokenizer(model: llm.Model) -> None:
  if model.tokenizer is None:
    raise ValueError("the model has no tokenizer; agents need one to render chats and decode")


def _sample(model: llm.Model, prompts: Sequence[list[int]], adapter, *, rng, max_new_tokens,
            sampling, mesh, row_keys=None) -> list[Generation]:
  _check_tokenizer(model)
  out = llm.sample(model, [list(p) for p in prompts],
                   llm.GenerationSettings.for_model(model, max_new_tokens, sampling), rng=rng,
                   mesh=mesh, adapter=adapter, row_keys=row_keys)
  return generations(model, len(prompts), out)


def _on_engine(generator) -> bool:
  return generator.engines is not None and engines_lib.runs_on_engine(generator.mesh)


def _engine_rows(generator, model, prompts, keys, max_new_tokens, sampling, experts, lora, role):
  """The rows on the generator's engines, each with its key; a row the engine cannot take runs
  alone on the static sampler with that key."""
  _check_tokenizer(model)

  def static(prompt, key):
    adapter = None if experts is None else make_adapter(experts, lora, model.config, [[role]],
                                                        kernel=generator.kernel)
    [gen] = _sample(model, [prompt], adapter, rng=key, max_new_tokens=max_new_tokens,
                    sampling=sampling, mesh=None, row_keys=jnp.stack([key]))
    return gen

  return generator.engines.submit(model, prompts, keys, max_new_tokens, sampling,
                                  experts=experts, lora=lora, role=role, kernel=generator.kernel,
                                  reply=functools.partial(_generation, model), static=static)


@dataclasses.dataclass
class AdapterGenerator:
  """Three role experts (planner, executor, distiller) on one frozen backbone.

  `experts` are the weights it samples with by default; `generate(..., experts=...)` samples with
  others, and `with_experts` gives a generator holding others (the trainers' current weights)."""

  model: llm.Model
  experts: dict
  lora: LoraConfig
  kernel: str = "auto"
  mesh: object = None
  engines: engines_lib.AgentEngines | None = None  # None: the static sampler

  def __post_init__(self):
    check_roles(self.lora, "AdapterGenerator")

  @property
  def tokenizer(self) -> ChatTokenizer:
    return self.model.tokenizer

  def tokenizer_of(self, module: str) -> ChatTokenizer:
    check_module(module)
    return self.model.tokenizer

  def generate(self, module: str, prompts: Sequence[list[int]], *, rng: jax.Array,
               max_new_tokens: int, sampling: llm.SamplingConfig,
               experts=None) -> list[Generation]:
    """experts: the role experts to sample with (None: `self.experts`)."""
    check_module(module)
    if not prompts:
      return []
    if _on_engine(self):
      return self.engines.wait(self.submit(module, prompts, keys=engines_lib.row_keys(
          rng, len(prompts)), max_new_tokens=max_new_tokens, sampling=sampling, experts=experts))
    sets = [[self.lora.role_index(module)]] * len(prompts)
    adapter = make_adapter(self.experts if experts is None else experts, self.lora,
                           self.model.config, sets, kernel=self.kernel)
    return _sample(self.model, prompts, adapter, rng=rng, max_new_tokens=max_new_tokens,
                   sampling=sampling, mesh=self.mesh)

  def submit(self, module: str, prompts: Sequence[list[int]], *, keys: Sequence[jax.Array],
             max_new_tokens: int, sampling: llm.SamplingConfig,
             experts=None) -> list[engines_lib.Pending]:
    """Each prompt on the engine drawing with its key (`generate`'s row i: fold_in(rng, i));
    `step` advances them. Needs `engines`."""
    check_module(module)
    return _engine_rows(self, self.model, prompts, keys, max_new_tokens, sampling,
                        self.experts if experts is None else experts, self.lora,
                        self.lora.role_index(module))

  def on_engine(self) -> bool:
    """Whether `submit` / `step` may be used (engines given, one device)."""
    return _on_engine(self)

  def step(self) -> None:
    self.engines.step()


@dataclasses.dataclass
class SeparateGenerator:
  """One backbone per module: {module: (model, experts or None, lora or None)}.

  With experts, the module's role expert is `lora.role_index(module)` when the lora has that
  role, else expert 0 (a single-adapter LoRA per model); without, the bare backbone runs."""

  modules: Mapping[str, tuple]
  kernel: str = "auto"
  mesh: object = None
  engines: engines_lib.AgentEngines | None = None  # None: the static sampler

  def __post_init__(self):
    if not self.modules:
      raise ValueError("SeparateGenerator.modules is empty")
    for module, entry in self.modules.items():
      check_module(module)
      if not isinstance(entry, tuple) or len(entry) != 3:
        raise ValueError(f"SeparateGenerator.modules[{module!r}] must be (model, experts, lora);"
                         f" got {entry!r:.80}")
      model, experts, lora = entry
      if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"SeparateGenerator.modules[{module!r}]: the model has no tokenizer")
      if (experts is None) != (lora is None):
        raise ValueError(f"SeparateGenerator.modules[{module!r}]: experts and lora must both be "
                         f"given or both be None")

  def _entry(self, module: str) -> tuple:
    check_module(module)
    if module not in self.modules:
      raise ValueError(f"SeparateGenerator has no model for module {module!r} "
                       f"(has {sorted(self.modules)})")
    return self.modules[module]

  @property
  def tokenizer(self) -> ChatTokenizer:
    """The executor's (else the first module's): the one shared when all backbones share one."""
    module = "executor" if "executor" in self.modules else next(iter(self.modules))
    return self.modules[module][0].tokenizer

  def tokenizer_of(self, module: str) -> ChatTokenizer:
    return self._entry(module)[0].tokenizer

  def generate(self, module: str, prompts: Sequence[list[int]], *, rng: jax.Array,
               max_new_tokens: int, sampling: llm.SamplingConfig) -> list[Generation]:
    model, experts, lora = self._entry(module)
    if not prompts:
      return []
    if _on_engine(self):
      return self.engines.wait(self.submit(module, prompts, keys=engines_lib.row_keys(
          rng, len(prompts)), max_new_tokens=max_new_tokens, sampling=sampling))
    adapter = None
    if experts is not None:
      adapter = make_adapter(experts, lora, model.config, [[self._role(module)]] * len(prompts),
                             kernel=self.kernel)
    return _sample(model, prompts, adapter, rng=rng, max_new_tokens=max_new_tokens,
                   sampling=sampling, mesh=self.mesh)

  def _role(self, module: str) -> int:
    lora = self._entry(module)[2]
    return lora.role_index(module) if module in lora.roles else 0

  def submit(self, module: str, prompts: Sequence[list[int]], *, keys: Sequence[jax.Array],
             max_new_tokens: int, sampling: llm.SamplingConfig) -> list[engines_lib.Pending]:
    """As AdapterGenerator.submit, on the module's backbone (one engine per backbone)."""
    model, experts, lora = self._entry(module)
    return _engine_rows(self, model, prompts, keys, max_new_tokens, sampling, experts, lora,
                        0 if experts is None else self._role(module))

  def on_engine(self) -> bool:
    """Whether `submit` / `step` may be used (engines given, one device)."""
    return _on_engine(self)

  def step(self) -> None:
    self.engines.step()
