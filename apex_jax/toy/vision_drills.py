"""The vision toy's drills (issue 56 item 5): conversations of the synthetic world's image
questions as the agents hold them, each with its images, for `apex_jax.toy.vision_train`.

- `executor_conversation`: an image question's gold run. Turn 1 calls
  `web_image_to_image_search` (`{"img_idx": "0"}`); the tool's text and its 3 images come back
  as `tools.image_search` gives them from the cache `datasets.world_images` writes (the match
  first, then the nearest emblems of its kind, rendered with the same keys); turn 2 names the
  first title's entity and searches the chain's first hop, which names it; then the text run.
- `planner_conversation`: the plan of an image question, its caption shown after it as
  `prompts.plan_messages` shows it, earlier image questions' memories (`memory_of`: with their
  captions or text-only, as either bank renders them) shown or not; step 1 names the entity by
  the image search, the hops' plan steps refer to it as "<result of step 1>".
- `reading_conversation`: the reading drill: an entity's emblem and "What does the emblem in
  the image look like?", the reply its caption (`world_emblems.caption`). The planner never sees pixels;
  this is what the tower is taught to see.

A conversation is the text toy's dict (`toy.corpus.conversation`) plus "images": one
(emblem, variant, key) recipe per `<image>` marker, in order, rendered by `render_images`.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

from apex_jax.agents import prompts
from apex_jax.agents.config import AgentConfig
from apex_jax.agents.prompts import numbered
from apex_jax.datasets import world_emblems, world_images
from apex_jax.datasets.records import QAExample
from apex_jax.memory import skills as skills_lib
from apex_jax.memory.records import Memory
from apex_jax.toy import corpus as C
from apex_jax.tools import image_search
from apex_jax.tools import images as images_lib

READ_PROMPT = "What does the emblem in the image look like?"


def image_call() -> str:
  """The image search call as the executor writes it (the search call's layout)."""
  payload = {"name": image_search.NAME, "arguments": {"img_idx": "0"}}
  return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


def shown(world, example: QAExample) -> list[str]:
  """The entities of the question's image-search results: the match, then its distractors."""
  match = world_images.anchor(world, example)
  return [match] + world_images.distractors(world, match, world_images.RESULTS - 1)


def question_image(world, example: QAExample) -> tuple:
  return (world.emblems[world_images.anchor(world, example)], 0, "")


def result_images(world, example: QAExample) -> list[tuple]:
  """The recipes `world_images.write_entry` renders the cache's img_000 ... with."""
  return [(world.emblems[e], 1 + k, f"{example.id}:{e}") for k, e in enumerate(shown(world, example))]


def render_images(recipes: Sequence[tuple]) -> list:
  return [world_emblems.render(emblem, variant, key) for emblem, variant, key in recipes]


def executor_conversation(world, example: QAExample, searcher, config: AgentConfig,
                          plan: str | None, spaced: bool = False) -> dict | None:
  """The image question's gold run (None when a search misses its hop, as the text drills)."""
  gold = C.executor_rounds(example, searcher, config, spaced=spaced)
  if gold is None:
    return None
  entities = shown(world, example)
  name = world.name(entities[0])
  kind = world.entities[entities[0]].kind
  results = image_search.results_text([f"The emblem of {world.name(e)}" for e in entities])
  first = gold[0]["text"].replace("<think>", f"<think>The image: {name}. ", 1)
  replies = [f"<think>Name the {kind} in the image.</think>\n{image_call()}", first] + \
      [t["text"] for t in gold[1:]]
  follow = [[prompts.tool_message(results)]] + \
      [[prompts.tool_message(t["tool_output"])] for t in gold[:-1]]
  opening = prompts.executor_messages(example.question, plan, config.prompt_style, image=True)
  outputs = [results] + [t["tool_output"] for t in gold]
  trace = [{"text": r, "tool_output": o} for r, o in zip(replies, outputs)]  # the judge's view
  return C.conversation("apex_execute", opening, replies, follow, example.id,
                        images=[question_image(world, example)] + result_images(world, example),
                        trace=trace)


_STEP_REF = re.compile(r"result of step (\d+)")


def plan_steps(world, example: QAExample) -> list[str]:
  """Step 1 names the pictured entity by the image search; the text plan's steps follow, the
  entity's name as "<result of step 1>" (the later references shifted by one)."""
  entity = world_images.anchor(world, example)
  name, kind = world.name(entity), world.entities[entity].kind
  later = [_STEP_REF.sub(lambda m: f"result of step {int(m.group(1)) + 1}", s)
           for s in C.plan_steps(example)]
  return [f"Search the image to name the {kind}."] + [s.replace(name, "<result of step 1>")
                                                       for s in later]


def memory_of(world, example: QAExample, conversation: dict, memory_id: int,
              with_caption: bool) -> Memory:
  """The bank's memory of an image question's gold run (`executor_conversation`), its workflow
  by rule (`prompts.rule_workflow`, as the demo writes them); with_caption: a text-image
  memory (the bank's `text_image`), else text-only."""
  replies = [conversation["target"]] + [r["target"] for r in conversation["rounds"]]
  return Memory(memory_id, example.category, "text-image" if with_caption else "text-only",
                example.question, prompts.rule_workflow(replies), "correct",
                caption=example.caption if with_caption else None)


def planner_conversation(world, example: QAExample, trace: list[dict], config: AgentConfig,
                         earlier: Sequence[Memory] = ()) -> dict:
  """The plan of an image question whose run answered (trace: `executor_conversation`'s
  "trace"): the plan, then "no" (no replan). earlier: memories the plan prompt shows (the
  plan names none of their entities either)."""
  memory = skills_lib.render_memories(list(earlier), []).strip()
  opening = prompts.plan_messages(prompts.NO_SKILL, memory, example.question,
                                  config.plan_word_limit, config.prompt_style,
                                  caption=example.caption)
  plan = f"<think>{example.hops + 1} searches.</think>\n{numbered(plan_steps(world, example))}"
  searches = example.hops + 1
  decision = (f"<think>{searches} of {searches} searches done; the answer is in the "
              f"results.</think>\nno")
  follow = [[prompts.judge_message(example.question, trace, config.prompt_style)]]
  return C.conversation("apex_plan", opening, [plan, decision], follow, example.id)


def reading_conversation(world, entity_id: str, variant: int = 0) -> dict:
  """The reading drill on an entity's emblem (variant > 0: a search result's near copy)."""
  emblem = world.emblems[entity_id]
  opening = [{"role": "user", "content": f"{images_lib.MARKER}\n{READ_PROMPT}"}]
  return C.conversation("apex_see", opening, [world_emblems.caption(emblem)], [],
                        f"{world.seed}:{entity_id}",
                        images=[(emblem, variant, f"read:{entity_id}" if variant else "")])
