"""The agents' sampler on a Qwen2.5-VL backbone: `VlGenerator` (the three role experts on the
language model, as `AdapterGenerator`) and its chat tokenizer `VlChatTokenizer`.

A chat's `<image>` markers are images only when the chat holds images (`Conversation` passes
their count): then each becomes the image block of 256 pad tokens (`vision_chat.qwen_vl_ids`)
and its uint8 image goes with the row into `vl_sampling.sample` (the tower once per call over
every row's images). A chat without images (the planner's, which quotes questions) keeps its
markers as text, and a text row samples as on the text backbone.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from morse_jax import llm
from morse_jax.llm import vision, vl, vl_sampling
from morse_jax.lora.experts import LoraConfig, make_adapter

from apex_jax.agents import vision_chat
from apex_jax.agents.generator import Generation, check_roles, check_module, generations
from apex_jax.tools import images as images_lib


def pixels(images: Sequence, image_size: int) -> list:
  """uint8 images -> the tower's normalised [3, image_size, image_size] inputs."""
  return [vision.normalize(images_lib.resized(x, image_size)) for x in images]


class VlChatTokenizer:
  """A Qwen2.5-VL model's tokenizer (`llm.Tokenizer`) rendering chats with `qwen_vl_ids`, each
  image as the tokens of an image_size x image_size one."""

  takes_images = True

  def __init__(self, tokenizer, image_size: int = images_lib.IMAGE_SIZE):
    if tokenizer is None:
      raise ValueError("the VL model has no tokenizer; agents need one to render chats")
    self.base = tokenizer
    self.tokens_per_image = vision_chat.image_tokens(image_size)
    vision_chat.special_ids(tokenizer)  # refuses a vocabulary without the template's tokens

  @property
  def pad_id(self) -> int:
    return self.base.pad_id

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                          images: int = 0, **kwargs) -> list[int]:
    """images: how many of the markers are images (all of them, or 0: markers stay text)."""
    if kwargs:
      raise ValueError(f"VlChatTokenizer.apply_chat_template: unsupported {sorted(kwargs)}")
    return vision_chat.qwen_vl_ids(self.base, messages, images,
                                   add_generation_prompt=add_generation_prompt,
                                   tokens_per_image=self.tokens_per_image)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self.base.encode(text, add_special_tokens)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.base.decode(ids, skip_special_tokens)


@dataclasses.dataclass
class VlGenerator:
  """Three role experts (LoRA on the language model) on one frozen Qwen2.5-VL backbone;
  `generate(..., images=)` takes each prompt's images. The tower has no experts.
  image_size: every image is resized to it (448: the authors'; a multiple of 28 below it is a
  smaller bucket, fewer tokens per image, for a toy backbone on a CPU)."""

  model: vl.VlModel
  experts: dict
  lora: LoraConfig
  kernel: str = "auto"
  mesh: object = None
  image_size: int = images_lib.IMAGE_SIZE
  takes_images = True

  def __post_init__(self):
    check_roles(self.lora, "VlGenerator")
    self._tokenizer = VlChatTokenizer(self.model.tokenizer, self.image_size)

  @property
  def tokenizer(self) -> VlChatTokenizer:
    return self._tokenizer

  def tokenizer_of(self, module: str) -> VlChatTokenizer:
    check_module(module)
    return self._tokenizer

  def generate(self, module: str, prompts: Sequence[list[int]], *, rng: jax.Array,
               max_new_tokens: int, sampling: llm.SamplingConfig, experts=None,
               images: Sequence[Sequence] | None = None) -> list[Generation]:
    """images: per prompt its uint8 [H, W, 3] images in the order of its image blocks (None:
    no prompt has any); experts: as `AdapterGenerator.generate`."""
    check_module(module)
    if not prompts:
      return []
    rows = [[] for _ in prompts] if images is None else [list(r) for r in images]
    if len(rows) != len(prompts):
      raise ValueError(f"VlGenerator.generate: images for {len(rows)} prompts, "
                       f"{len(prompts)} prompts")
    sets = [[self.lora.role_index(module)]] * len(prompts)
    adapter = make_adapter(self.experts if experts is None else experts, self.lora,
                           self.model.config.text, sets, kernel=self.kernel)
    text = self.model.text
    out = vl_sampling.sample(
        self.model, [list(p) for p in prompts], [pixels(r, self.image_size) for r in rows],
        llm.GenerationSettings.for_model(text, max_new_tokens, sampling), rng=rng,
        adapter=adapter, mesh=self.mesh)
    return generations(text, len(prompts), out)
