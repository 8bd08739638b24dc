"""Text is text (issue 52) in MoRSE's prompts: upstream artifacts, the planner's subtask titles
and descriptions, a rejected plan shown back to the planner and the family's reply prefix carry
the probe; the token prompts hold only the template's markers (tests/text_probe.py)."""

import json
import types

import numpy as np
import pytest

from morse_jax.mas import planner, runner
from morse_jax.mas.agents import Agents
from morse_jax.mas.graph import SubtaskGraph
from morse_jax.tasks.base import NodeScore, Problem
from tests.text_probe import BENIGN, CHATML, PROBE, assert_text_is_text, tokenizer

SPELLED = "<|im_start|>assistant"


class Family:
  def executor_instructions(self, problem, node):
    return "Write the function."

  def reply_prefix(self, problem, node):  # the prompt's code, as HumanEval's prefill
    return f"```python\n{problem.statement}\n"


def diamond(text):
  nodes = [{"id": i, "title": f"{i}: {text}", "description": f"do {text}", "depends_on": deps}
           for i, deps in (("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]))]
  graph = SubtaskGraph.from_obj(nodes)
  task = runner.TaskOutcome(Problem("p0", "words", "c", f"def f():\n  '''{text}'''"), graph)
  for i in "abc":
    task.nodes[i] = runner.NodeOutcome(i, [0], "", f"def g_{i}():\n  return {text!r}",
                                       NodeScore(1.0, True))
  return task


def agents(name):
  return Agents(model=types.SimpleNamespace(tokenizer=tokenizer(name)), lora=None, router=None,
                embed=None)


def merger_prompt(name, text):
  task = diamond(text)
  [(_, (tokens, _))] = runner._merge_inputs(agents(name), [task], [(0, task.graph.node("d"))],
                                            "union", np.random.default_rng(0))
  return tokens


def executor_prompt(name, text):
  task, ag = diamond(text), agents(name)
  [(context, _)] = runner._merge_inputs(ag, [task], [(0, task.graph.node("b"))], "union",
                                        np.random.default_rng(0))
  return runner.executor_prompt(ag, Family(), task, task.graph.node("b"), context)


def planner_retry_prompt(name, text):
  """The retry shows the planner its rejected reply and the error naming it."""
  ag, sent = agents(name), []
  replies = iter([json.dumps({"subtasks": [{"id": text}]}),
                  json.dumps({"subtasks": [{"id": "1", "title": "t", "description": "d",
                                            "depends_on": []}]})])

  def generate(batch):
    sent.extend(ag.tokens(m) for m in batch)
    return [next(replies) for _ in batch]

  planner.plan([Problem("p0", "words", "c", "task")], generate, max_retries=1)
  return sent[1]


BUILDERS = {"merger_with_upstream_artifacts": merger_prompt,
            "executor_with_context_plan_and_prefix": executor_prompt,
            "planner_retry_with_its_reply": planner_retry_prompt}


@pytest.mark.parametrize("name", CHATML)
@pytest.mark.parametrize("builder", list(BUILDERS))
def test_morse_prompts_hold_the_probe_as_text(name, builder):
  build = BUILDERS[builder]
  assert_text_is_text(tokenizer(name), [build(name, PROBE)], [build(name, BENIGN)], SPELLED)
