"""The vision toy's drills (apex_jax.toy.vision_drills): each is the chat the agents hold on an
image question, its images those the image-search cache holds, encoded with image blocks."""

from __future__ import annotations

import numpy as np
import pytest

from apex_jax.agents.config import AgentConfig
from apex_jax.datasets import world_emblems, world_images
from apex_jax.datasets.world import World
from apex_jax.tools import image_search
from apex_jax.tools.images import MARKER
from apex_jax.tools.overlap import WordSearch
from apex_jax.tools.protocol import ToolCall, parse_turn
from apex_jax.toy import vision_drills as vd

COMPACT = AgentConfig(prompts="compact", topk=2)


@pytest.fixture(scope="module")
def world():
  return World.generate(11, 60, 24, image_share=1.0)


@pytest.fixture(scope="module")
def run(world):
  searcher = WordSearch(world.passages, COMPACT.topk)
  for ex in (e for e in world.examples if e.images):
    conv = vd.executor_conversation(world, ex, searcher, COMPACT, plan=None, spaced=True)
    if conv is not None:
      return ex, conv
  pytest.fail("no image question with a gold run in the world")


def _replies(conv):
  return [conv["target"]] + [r["target"] for r in conv["rounds"]]


def test_the_run_calls_the_image_search_then_searches_the_first_titles_entity(world, run):
  ex, conv = run
  replies = _replies(conv)
  call = parse_turn(replies[0], tools=("search", image_search.NAME))
  assert isinstance(call, ToolCall) and call.name == image_search.NAME
  match = world_images.anchor(world, ex)
  name = world.name(match)
  assert name not in ex.question and name not in conv["messages"][0]["content"]
  second = parse_turn(replies[1], tools=("search",))
  assert isinstance(second, ToolCall) and name in second.queries[0]
  assert f"The image: {name}." in replies[1]
  assert f"<answer> {ex.answers[0]}</answer>" in replies[-1]


def test_the_tool_text_and_images_are_the_caches(world, run, tmp_path):
  ex, conv = run
  world_images.write_entry(world, str(tmp_path), ex)
  cached = image_search.ImageSearch(str(tmp_path)).search(ex.id)
  assert conv["rounds"][0]["messages"][0]["content"] == f"<tool_response>\n{cached.text}\n</tool_response>"
  rendered = vd.render_images(conv["images"])
  assert len(rendered) == 4 == 1 + len(cached.images)
  for got, want in zip(rendered[1:], cached.images):
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(rendered[0], world_emblems.render(world.emblems[
      world_images.anchor(world, ex)]))
  markers = sum(m["content"].count(MARKER) for m in conv["messages"]) + \
      sum(m["content"].count(MARKER) for r in conv["rounds"] for m in r["messages"])
  assert markers == len(conv["images"])


def test_the_plan_names_no_entity_and_shows_the_caption(world, run):
  ex, conv = run
  plan = vd.planner_conversation(world, ex, conv["trace"], COMPACT)
  name = world.name(world_images.anchor(world, ex))
  steps = vd.plan_steps(world, ex)
  assert steps[0].startswith("Search the image") and len(steps) == ex.hops + 2
  assert all(name not in s for s in steps) and "<result of step 1>" in steps[1]
  assert name not in plan["target"] and ex.caption in plan["messages"][-1]["content"]
  assert plan["rounds"][0]["target"].endswith("no")


def test_the_reading_drill_answers_the_caption(world):
  entity = next(iter(world.entities))
  conv = vd.reading_conversation(world, entity, variant=2)
  assert conv["target"] == world_emblems.caption(world.emblems[entity])
  (image,) = vd.render_images(conv["images"])
  assert image.shape == (448, 448, 3) and not np.array_equal(
      image, world_emblems.render(world.emblems[entity]))  # a near copy, not the question's


def test_the_plans_last_step_answers_with_the_last_search(world, run):
  ex, _ = run
  assert ex.kind == "chain"  # world_images.ELIGIBLE: image questions are chain questions
  assert vd.plan_steps(world, ex)[-1] == f"Answer with the result of step {ex.hops + 1}."


def test_a_plan_shown_earlier_memories_renders_them_as_either_bank_does(world, run):
  ex, conv = run
  with_caption = vd.memory_of(world, ex, conv, 1, with_caption=True)
  text_only = vd.memory_of(world, ex, conv, 2, with_caption=False)
  assert with_caption.modality == "text-image" and with_caption.caption == ex.caption
  assert text_only.modality == "text-only" and text_only.caption is None
  assert "web_image_to_image_search" not in with_caption.workflow_summary
  assert with_caption.workflow_summary.splitlines()[-1].endswith(f"answer ' {ex.answers[0]}'")
  plan = vd.planner_conversation(world, ex, conv["trace"], COMPACT, [with_caption])
  prompt = plan["messages"][-1]["content"]
  assert f"Image Caption: {ex.caption}" in prompt and "Image-Text modality" in prompt
  assert plan["target"] == vd.planner_conversation(world, ex, conv["trace"], COMPACT)["target"]
