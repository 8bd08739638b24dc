"""APEx's agents on a Qwen2.5-VL backbone (agents.vl_generator, training.grpo.VlModuleUpdater):
an image question's episode on the random tiny model, its executor calling the image search and
sampling its next turn with the results' images; the update's loss equal to one computed from
whole-sequence `vl.forward` log-probs; text rows as on a text chat; refusals."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from apex_jax import experiment, pipeline
from apex_jax.agents import AgentConfig, Executor, vision_chat, vl_generator
from apex_jax.agents.conversation import Conversation
from apex_jax.agents.generator import APEX_ROLES
from apex_jax.agents.vl_generator import VlChatTokenizer, VlGenerator
from apex_jax.training.grpo import FrozenUpdater, VlModuleUpdater
from morse_jax import lora as lora_lib
from morse_jax.llm import vision, vl, vl_sampling
from morse_jax.llm.tokenizer import Tokenizer
from morse_jax.rl import advantages as advantages_lib
from morse_jax.rl.logprobs import log_softmax
from morse_jax.rl.losses import policy_loss
from tests.apex.agents import fakes
from tests.apex.agents.test_executor_images import QUESTION_IMAGE, cache
from tests.apex.memory.fakes import HashEmbedder
from tests.apex.test_experiment import small_config
from tests.tiny_models import VL_TOKENS, VL_VOCAB, make_byte_tokenizer

LORA = lora_lib.LoraConfig(roles=APEX_ROLES, num_subtask_experts=0, last_n_layers=1, rank=2)
CALL = ['<think>', 'w9', '</think>', '<tool_call>', '{"name":', '"web_image_to_image_search",',
        '"arguments":', '{"img_idx":', '"0"}}', '</tool_call>']
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VISION = {"<|image_pad|>": VL_TOKENS["image_token_id"],
          "<|video_pad|>": VL_TOKENS["video_token_id"],
          "<|vision_start|>": VL_TOKENS["vision_start_token_id"],
          "<|vision_end|>": VL_TOKENS["vision_end_token_id"]}


def make_tokenizer() -> Tokenizer:
  """A word-level tokenizer over the tiny VL model's 128 ids, Qwen2.5-VL's special tokens at
  the model's ids and the image search's call as words."""
  from tokenizers import Tokenizer as Core
  from tokenizers import models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = SPECIAL + ["<unk>", "system", "user", "assistant", "<answer>", "</answer>"] + CALL
  words += [f"w{i}" for i in range(min(VISION.values()) - len(words))]
  vocab = {w: i for i, w in enumerate(words)} | VISION
  vocab |= {f"x{i}": i for i in range(max(VISION.values()) + 1, VL_VOCAB)}
  core = Core(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  hf = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|endoftext|>",
                               eos_token="<|im_end|>", unk_token="<unk>",
                               additional_special_tokens=["<|im_start|>", *VISION])
  return Tokenizer(hf, "test-vl-tokenizer")


def chained(model: vl.VlModel, chain: list[int]) -> vl.VlModel:
  """The model with attention and MLP outputs zeroed, so each token's logits are its
  embedding's: the head maps chain[i] to chain[i + 1] (greedy), a real sampler run whose
  output the test knows."""
  text = model.params.text
  layers = dataclasses.replace(text.layers, wo=jnp.zeros_like(text.layers.wo),
                               w_down=jnp.zeros_like(text.layers.w_down))
  embed = np.asarray(text.embed)
  unit = embed / np.linalg.norm(embed, axis=-1, keepdims=True)
  head = np.zeros(embed.shape, np.float32)  # [vocab, hidden]
  for a, b in zip(chain, chain[1:]):
    head[b] = 30.0 * unit[a]
  text = dataclasses.replace(text, layers=layers, final_norm=jnp.ones_like(text.final_norm),
                             lm_head=jnp.asarray(head))
  return dataclasses.replace(model, params=dataclasses.replace(model.params, text=text))


@pytest.fixture(scope="module")
def models(vl_folder):
  tok = make_tokenizer()
  model = dataclasses.replace(vl.load(vl_folder[0]), tokenizer=tok,
                              stop_ids=(tok.hf.convert_tokens_to_ids("<|im_end|>"),))
  # the sampler bounds a row's tokens by it; a world question with 3 images takes ~1150
  text = dataclasses.replace(model.config.text, max_position_embeddings=4096)
  model = dataclasses.replace(model, config=dataclasses.replace(model.config, text=text))
  chain = tok.hf.convert_tokens_to_ids(["assistant", *CALL, "<|im_end|>"])
  return model, chained(model, chain), chain


@pytest.fixture(scope="module")
def episode(models, tmp_path_factory):
  """An image question and a text one through the executor on the chained model; each
  sampler call's images per row recorded."""
  _, chain_model, _ = models
  experts = lora_lib.init_experts(LORA, chain_model.config.text, jax.random.key(1))
  gen = VlGenerator(chain_model, experts, LORA)
  config = AgentConfig(prompts="compact", temperature=0.0, executor_max_new_tokens=16)
  ex = Executor(gen, fakes.FakeSearcher(), config,
                image_search=cache(tmp_path_factory.mktemp("vl_episode")))
  with recorded() as calls:
    trajs = ex.run(["w40 w41", "w42"], rng=jax.random.key(0), images=[QUESTION_IMAGE, None],
                   data_ids=["q1", None])
  return trajs, calls


@contextlib.contextmanager
def recorded():
  """Records each `vl_sampling.sample` call's images per row (their counts)."""
  calls = []
  sample = vl_sampling.sample

  def spy(model, prompts, images, *args, **kwargs):
    calls.append([len(row) for row in images])
    return sample(model, prompts, images, *args, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(vl_sampling, "sample", spy)
    yield calls


@pytest.mark.slow  # ~45 s on 2 cores: the tiny model's folder, two sampler compiles
def test_image_episode_samples_with_the_search_results_images(models, episode):
  _, _, chain = models
  (image, text), calls = episode
  # round 1: the image row with its question's image, the text row with none; round 2: the
  # image row with the question's image and the two results'
  assert calls == [[1, 0], [3]]
  assert image.stats["image_searches"] == 1 and image.stats["image_search_errors"] == 0
  assert image.stats["format_error_repeated_image_search"] == 1  # round 2 called it again
  assert len(image.info["images"]) == 3
  prompt = [int(t) for s in image.segments[:3] for t in s.tokens]
  assert prompt.count(VL_TOKENS["image_token_id"]) == 3 * vision_chat.image_tokens()
  for generated in (image.segments[1], image.segments[3], text.segments[1]):
    np.testing.assert_array_equal(generated.tokens, chain[1:])  # the real sampler's tokens
  assert text.stats["format_error_unknown_tool"] == 1  # a text question has no image tool
  assert not any(int(t) == VL_TOKENS["image_token_id"] for t in text.segments[0].tokens)


def whole_sequence_logprobs(model, traj):
  tokens = np.concatenate([np.asarray(s.tokens, np.int32) for s in traj.segments])
  images = [vision.normalize(x) for x in traj.info["images"]]
  pixels, grids, _ = vl_sampling.pixels_of(model.config, [images])
  logits, _ = vl.forward(model.params, model.config, tokens[None], pixels, grids)
  logp = np.take_along_axis(np.asarray(log_softmax(logits))[0, :-1], tokens[1:, None], -1)[:, 0]
  return np.concatenate([[0.0], logp])


@pytest.mark.slow  # ~40 s on 2 cores: the update's compile
def test_update_loss_equals_the_whole_sequence_reference(models, episode):
  """The random model's update on the episode's two rows (image row, text row; rewards 1, 0):
  its loss equals the GRPO loss of log-probs from `vl.forward` on each whole sequence with its
  images (the experts start as the identity edit)."""
  model, _, _ = models
  trajs, _ = episode
  updater = VlModuleUpdater.of(model, LORA)
  experts = lora_lib.init_experts(LORA, model.config.text, jax.random.key(1))
  _, _, metrics = updater.update(experts, updater.init_opt_state(experts), "executor",
                                 [trajs], [[1.0, 0.0]])
  length = max(sum(len(s.tokens) for s in t.segments) for t in trajs)

  def padded(values):
    return np.pad(np.asarray(values, np.float32), (0, length - len(values)))

  logp = np.stack([padded(whole_sequence_logprobs(model, t)) for t in trajs])
  old = np.stack([padded(np.concatenate([s.logprobs if s.logprobs is not None else
                                         np.zeros(len(s.tokens)) for s in t.segments]))
                  for t in trajs])
  mask = np.stack([padded(np.concatenate([np.full(len(s.tokens), s.logprobs is not None)
                                          for s in t.segments])) for t in trajs])
  adv = advantages_lib.grpo(jnp.asarray([[1.0, 0.0]]))[0]
  want, _ = policy_loss(jnp.asarray(logp), jnp.asarray(old), adv, jnp.asarray(mask))
  np.testing.assert_allclose(metrics["expert_loss"], float(want), rtol=1e-5)


def test_chat_without_images_keeps_its_markers_as_text(models):
  """A chat that only quotes a question (the planner's) renders its marker as text; a chat with
  its image renders the image block; a count that does not match the markers is refused."""
  model, _, _ = models
  tok = VlChatTokenizer(model.tokenizer)
  messages = [{"role": "user", "content": "w1 <image> w2"}]
  quoted = Conversation.start(tok, messages).tokens()
  shown = Conversation.start(tok, messages, [QUESTION_IMAGE]).tokens()
  assert VL_TOKENS["image_token_id"] not in quoted
  assert shown.count(VL_TOKENS["image_token_id"]) == vision_chat.image_tokens()
  assert len(shown) - len(quoted) == vision_chat.image_tokens() + 2 - 1  # block for the word
  with pytest.raises(ValueError, match="2 image"):
    tok.apply_chat_template(messages, images=2)


@pytest.mark.parametrize("byte_level", [False, True])
def test_ids_are_the_template_text_tokenised(models, byte_level):
  """`qwen_vl_ids` = the tokens of `qwen_vl_text` parsed with its special tokens, for a chat
  with a system turn, two images and a generation prompt, with the word-level tokenizer and a
  byte-level one (where every newline of the template is a token)."""
  tok = models[0].tokenizer
  if byte_level:
    hf = make_byte_tokenizer()
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *VISION]})
    tok = Tokenizer(hf, "test-byte-tokenizer")
  messages = [{"role": "system", "content": "w3"},
              {"role": "user", "content": "w1 <image> w2 <image>"},
              {"role": "assistant", "content": "w4"}]
  want = tok.encode(vision_chat.qwen_vl_text(messages, [QUESTION_IMAGE] * 2),
                    parse_special_tokens=True)
  assert vision_chat.qwen_vl_ids(tok, messages, 2) == want
  assert VlChatTokenizer(tok).apply_chat_template(messages, images=2) == want


def test_a_smaller_size_bucket(models):
  """image_size 56: each image takes 4 tokens (16 patches, 2 x 2 merged) and is resized to
  56 x 56 for the tower; 50 px is refused by name."""
  model, _, _ = models
  messages = [{"role": "user", "content": "w1 <image> w2"}]
  prompt = Conversation.start(VlChatTokenizer(model.tokenizer, 56), messages,
                              [QUESTION_IMAGE]).tokens()
  assert prompt.count(VL_TOKENS["image_token_id"]) == 4
  [shown] = vl_generator.pixels([QUESTION_IMAGE], 56)
  np.testing.assert_allclose(shown, vision.normalize(np.full((56, 56, 3), 7, np.uint8)))
  with pytest.raises(ValueError, match="image size 50 is not a positive multiple"):
    VlChatTokenizer(model.tokenizer, 50)


@pytest.mark.slow  # ~17 s on 2 cores: a sampler compile
def test_a_smaller_size_bucket_samples(models):
  model, _, _ = models
  gen = VlGenerator(model, lora_lib.init_experts(LORA, model.config.text, jax.random.key(1)),
                    LORA, image_size=56)
  messages = [{"role": "user", "content": "w1 <image> w2"}]
  prompt = Conversation.start(gen.tokenizer, messages, [QUESTION_IMAGE]).tokens()
  [out] = gen.generate("executor", [prompt], rng=jax.random.key(0), max_new_tokens=2,
                       sampling=AgentConfig(temperature=0.0).sampling, images=[[QUESTION_IMAGE]])
  assert len(out.tokens) == 2  # the 448 image went to the tower at 56 x 56, as its 4 pads say


def test_refusals(models):
  model, _, _ = models
  with pytest.raises(ValueError, match="no tokenizer"):
    VlGenerator(dataclasses.replace(model, tokenizer=None), {}, LORA)
  with pytest.raises(ValueError, match="lacks the module role"):
    VlGenerator(model, {}, lora_lib.LoraConfig(roles=("planner",), num_subtask_experts=0))
  gen = VlGenerator(model, lora_lib.init_experts(LORA, model.config.text, jax.random.key(1)),
                    LORA)
  with pytest.raises(ValueError, match="images for 2 prompts, 1 prompts"):
    gen.generate("executor", [[1, 2]], rng=jax.random.key(0), max_new_tokens=2,
                 sampling=AgentConfig().sampling, images=[[], []])
  with pytest.raises(ValueError, match="kl_coef"):
    VlModuleUpdater.of(model, LORA, recompute_logp_old=True)
  frozen = FrozenUpdater.of(VlModuleUpdater.of(model, LORA))  # TTRL's w/o-planner row
  assert frozen.model.config == model.config.text and frozen.lora == LORA


def test_load_backbone_reads_a_vl_folder(models, vl_folder, tmp_path):
  """experiment.load_backbone: a qwen2_5_vl folder (with its tokenizer) -> a VlModel."""
  model, _, _ = models
  for name in os.listdir(vl_folder[0]):
    shutil.copy(os.path.join(vl_folder[0], name), tmp_path / name)
  model.tokenizer.save(str(tmp_path))
  loaded = experiment.load_backbone(str(tmp_path), "float32")
  assert isinstance(loaded, vl.VlModel) and loaded.tokenizer is not None
  np.testing.assert_array_equal(loaded.params.text.embed, model.params.text.embed)


@pytest.mark.slow  # ~60 s on 2 cores: planner and executor compiles
def test_the_pipeline_on_a_vl_backbone(models, tmp_path):
  """experiment.build on a Qwen2.5-VL model: VL generator and updater, the world's image
  search cache; the held-out evaluation runs its image questions through them."""
  _, chain_model, _ = models
  c = small_config(tmp_path, untrained=False)
  c.eval.update(questions=4, batch_size=4)
  c.data.image_share = 0.5
  c.agents.update(executor_max_new_tokens=16, planner_max_new_tokens=16)
  exp = experiment.build(c, model=chain_model, embedder=HashEmbedder(64))
  assert isinstance(exp.generator, VlGenerator) and isinstance(exp.updater, VlModuleUpdater)
  assert exp.model.config == chain_model.config.text and exp.image_search is not None
  asked = [e for e in exp.test[:4] if e.images]
  assert asked  # the evaluated questions hold image ones
  with recorded() as calls:
    result = pipeline.evaluate(exp, exp.experts, use_memories=False, use_skills=False)
  assert result["answered"] == 0.0  # the chain never answers
  # the executor's second round: each image question with its image and the 3 results' (the
  # text questions ended at round 1: they have no image tool); the planner's calls none
  assert [1 + 3] * len(asked) in calls and [0] * 4 in calls
