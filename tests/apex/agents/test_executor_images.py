"""Images through the executor and the episode: the question's image in the first turn, the
image search's results in the next one, its once-per-episode rule, its counted failures, the
caption in the planner's prompt and the memories' text-image bucket; the chat rendered for
Qwen2.5-VL and as OpenAI image parts."""

import io
import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from apex_jax.agents import AgentConfig, Distiller, Executor, Planner, run_episode, vision_chat
from apex_jax.agents.conversation import Conversation
from apex_jax.memory import MemoryBank, MemoryConfig
from apex_jax.tools import images, render_tool_call
from apex_jax.tools.image_search import FAILED, ImageSearch
from apex_jax.training.rewards import executor_checks
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder

RNG = jax.random.PRNGKey(0)
ANSWER = "<think>w5 w6</think><answer>w7 w8</answer>"
IMAGE_CALL = ('<think>w9</think><tool_call>\n{"name": "web_image_to_image_search", '
              '"arguments": {"img_idx": "0"}}\n</tool_call>')
QUESTION_IMAGE = np.full((448, 448, 3), 7, np.uint8)


def cache(tmp_path, n=2):
  folder = tmp_path / "cache" / "q1"
  os.makedirs(folder)
  (folder / "meta.json").write_text(json.dumps(
      {"search_results": [{"title": f"w{20 + i}", "image_url": "u"} for i in range(n)]}))
  for i in range(n):
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (10 * i, 0, 0)).save(buffer, "PNG")
    (folder / f"img_{i:03d}.png").write_bytes(buffer.getvalue())
  return ImageSearch(str(tmp_path / "cache"))


def by_turn(replies):
  return fakes.ScriptedGenerator(
      lambda module, prompt, _: replies[prompt.count("<|assistant|>") - 1])


def test_image_question_search_results_in_the_next_turn(tmp_path):
  gen = by_turn([IMAGE_CALL, ANSWER])
  [traj] = Executor(gen, fakes.FakeSearcher(), AgentConfig(), image_search=cache(tmp_path)).run(
      [" w40"], rng=RNG, images=[QUESTION_IMAGE], data_ids=["q1"])
  opening, _, tool = traj.info["messages"][:3]
  assert opening["content"].count(images.MARKER) == 1
  assert "web_image_to_image_search" in opening["content"]  # the authors' image prompt
  assert tool == {"role": "user", "content": "<tool_response>\n[Image Search Results]: \n"
                  "1. title: w20\n<image>\n2. title: w21\n<image>\n\n</tool_response>"}
  shown = traj.info["images"]
  assert len(shown) == 3 and shown[0] is not None
  np.testing.assert_array_equal(shown[0], QUESTION_IMAGE)
  np.testing.assert_array_equal(shown[2][0, 0], [10, 0, 0])  # the second result, in order
  assert traj.stats["image_searches"] == 1 and traj.stats["image_search_errors"] == 0
  assert traj.answer == "w7 w8" and traj.info["turns"][0]["images"] == 2
  assert [s.logprobs is not None for s in traj.segments] == [False, True, False, True]


def test_second_image_search_is_a_format_error_also_after_resume(tmp_path):
  search = cache(tmp_path)
  ex = Executor(by_turn([IMAGE_CALL, IMAGE_CALL]), fakes.FakeSearcher(),
                AgentConfig(on_format_error="end"), image_search=search)
  [traj] = ex.run([" w40"], rng=RNG, images=[QUESTION_IMAGE], data_ids=["q1"])
  assert traj.stats["format_error_repeated_image_search"] == 1
  assert traj.stats["end_format_error"] == 1 and traj.stats["image_searches"] == 1
  assert executor_checks(traj.text)[1] == 0.0  # the reward counts it the same way
  # once per episode: the resumed run may not call it again either
  ex2 = Executor(by_turn([IMAGE_CALL, ANSWER, IMAGE_CALL]), fakes.FakeSearcher(), AgentConfig(),
                 image_search=search)
  [first] = ex2.run([" w40"], rng=RNG, images=[QUESTION_IMAGE], data_ids=["q1"])
  [second] = ex2.resume([first], ["w31"], rng=RNG)
  assert len(second.info["images"]) == 3  # the earlier images stay with their markers
  assert second.stats["format_error_repeated_image_search"] == 1


def test_failed_lookup_is_counted_and_shows_the_authors_text(tmp_path):
  gen = by_turn([IMAGE_CALL, ANSWER])
  [traj] = Executor(gen, fakes.FakeSearcher(), AgentConfig(), image_search=cache(tmp_path)).run(
      [" w40"], rng=RNG, images=[QUESTION_IMAGE], data_ids=["missing"])
  assert traj.stats["image_search_errors"] == 1 and traj.answer == "w7 w8"
  assert traj.info["turns"][0]["tool_output"] == FAILED
  assert "no cached results for id 'missing'" in traj.info["turns"][0]["error"]
  assert len(traj.info["images"]) == 1


def test_text_question_is_not_offered_the_image_tool(tmp_path):
  gen = by_turn([IMAGE_CALL])
  [traj] = Executor(gen, fakes.FakeSearcher(), AgentConfig(), image_search=cache(tmp_path)).run(
      ["w40"], rng=RNG)
  assert traj.stats["format_error_unknown_tool"] == 1
  assert "web_image_to_image_search" not in traj.info["messages"][0]["content"]


def test_markers_in_search_results_and_questions_claim_no_image(tmp_path):
  call = f"<think>w9</think>{render_tool_call(['w20'])}"
  gen = by_turn([call, ANSWER])

  class MarkedSearcher(fakes.FakeSearcher):
    def search(self, queries, topk=None):
      out = super().search(queries, topk)
      return [[type(p)(p.id, p.contents + " <image>") for p in row] for row in out]

  [traj] = Executor(gen, MarkedSearcher(), AgentConfig(), image_search=cache(tmp_path)).run(
      [" w40 <image>"], ["plan <image>"], rng=RNG, images=[QUESTION_IMAGE], data_ids=["q1"])
  assert sum(m["content"].count(images.MARKER) for m in traj.info["messages"]) == 1
  assert traj.answer == "w7 w8"


def test_bad_image_inputs_refused_by_name():
  ex = Executor(by_turn([ANSWER]), fakes.FakeSearcher(), AgentConfig())
  with pytest.raises(images.ImageError, match=r"images\[0\]: expected a uint8 array"):
    ex.run([" w40"], rng=RNG, images=[np.zeros((8, 8, 3), np.uint8)])
  with pytest.raises(ValueError, match="1 plans, 2 images and 1 data_ids for 1 questions"):
    ex.run([" w40"], rng=RNG, images=[None, None])
  with pytest.raises(ValueError, match=r"1 image\(s\) for 2 <image> marker\(s\)"):
    Conversation.start(fakes.tokenizer(), [{"role": "user", "content": "<image><image>"}],
                       [QUESTION_IMAGE])


def test_caption_reaches_the_plan_prompt_and_the_text_image_bucket(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())
  bank.add("w40 w50", "1. search w60", True, category="location", caption="w70 w71")
  bank.add("w40 w51", "1. search w61", True, category="location")  # text-only bucket

  def reply(module, prompt, _):
    return "<think>w2</think>w10 w11" if module == "planner" else ANSWER
  gen = fakes.ScriptedGenerator(reply)
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG, bank=bank, categories=["location"], captions=["w70 w72"],
                     images=[QUESTION_IMAGE], data_ids=["q1"])
  plan_prompt = ep.planner.info["messages"][1]["content"]
  assert plan_prompt.rstrip().endswith("w40\n- Image Caption: w70 w72")
  assert "- Image Caption: w70 w71" in plan_prompt  # the text-image memory
  assert "w60" in plan_prompt and "w61" not in plan_prompt
  assert ep.bucket.modality == "text-image"
  assert len(ep.executor[0].info["images"]) == 1
  assert images.MARKER not in plan_prompt.split("[Question]")[-1]  # captions, never pixels


def test_qwen_vl_text_and_openai_parts():
  messages = [{"role": "user", "content": "look <image> and"},
              {"role": "assistant", "content": "ok"},
              {"role": "user", "content": "<tool_response>\n1. <image>\n</tool_response>"}]
  two = [QUESTION_IMAGE, np.zeros((448, 448, 3), np.uint8)]
  text = vision_chat.qwen_vl_text(messages, two)
  assert vision_chat.image_tokens() == 256
  assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                         "<|im_start|>user\nlook <|vision_start|><|image_pad|>")
  assert text.count("<|image_pad|>") == 512 and text.count("<|vision_start|>") == 2
  assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
  parts = vision_chat.openai_messages(messages, two)
  assert parts[1] == {"role": "assistant", "content": "ok"}
  assert [p["type"] for p in parts[0]["content"]] == ["text", "image_url", "text"]
  url = parts[2]["content"][1]["image_url"]["url"]
  np.testing.assert_array_equal(images.decode_base64(url, "url"), two[1])
  with pytest.raises(ValueError, match=r"1 image\(s\) for 2 <image> marker"):
    vision_chat.qwen_vl_text(messages, two[:1])


def test_the_episode_memory_keeps_the_caption(tmp_path):
  bank = MemoryBank(str(tmp_path / "m.db"), HashEmbedder(), config=MemoryConfig())

  def reply(module, prompt, _):
    return {"planner": "<think>w2</think>w10", "executor": ANSWER}.get(module, "1. w5")
  gen = fakes.ScriptedGenerator(reply)
  cfg = AgentConfig()
  [ep] = run_episode(Planner(gen, cfg), Executor(gen, fakes.FakeSearcher(), cfg), ["w40"],
                     rng=RNG, bank=bank, categories=["location"], captions=["w70"])
  _, [item] = Distiller(gen, cfg).workflow_memories([ep], [True], rng=RNG)
  assert item.caption == "w70" and item.modality == "text-image"
