"""Executor: the tool loop driven by a scripted generator and a fake searcher."""

import json

import jax
import numpy as np
import pytest

from apex_jax.agents import AgentConfig, Executor
from apex_jax.tools import render_tool_call
from morse_jax.rl.rollout import pack
from tests.apex.agents import fakes

RNG = jax.random.PRNGKey(0)
ANSWER = "<think>w5 w6</think><answer>w7 w8</answer>"


def call(*queries):
  return f"<think>w9</think>{render_tool_call(list(queries))}"


def turn_of(prompt):
  """How many assistant turns the prompt already holds (0 for the first)."""
  return prompt.count("<|assistant|>") - 1


def question_of(prompt):
  words = prompt.split()
  return next(w for w in ("w40", "w41", "w42", "w43") if w in words)


def scripted(script):
  """script: question word -> list of replies, one per turn."""
  return fakes.ScriptedGenerator(
      lambda module, prompt, _: script[question_of(prompt)][turn_of(prompt)])


def test_tool_call_then_answer_and_token_mask():
  gen = scripted({"w40": [call("w20 w21"), ANSWER]})
  searcher = fakes.FakeSearcher()
  [traj] = Executor(gen, searcher, AgentConfig()).run(["w40"], ["w30 w31"], rng=RNG)
  assert traj.answer == "w7 w8"
  assert traj.stats["turns"] == 2 and traj.stats["tool_calls"] == 1
  assert traj.stats["format_errors"] == 0 and traj.stats["end_answer"] == 1
  assert searcher.calls == [["w20 w21"]]
  assert traj.info["searches"] == [{"turn": 0, "queries": ["w20 w21"],
                                    "passage_ids": [["w20 w21#0", "w20 w21#1", "w20 w21#2"]]}]
  # prompt, turn 1 (trained), tool output (not), turn 2 (trained)
  trained = [s.logprobs is not None for s in traj.segments]
  assert trained == [False, True, False, True]
  tool_message = traj.info["messages"][2]["content"]
  assert tool_message.startswith("<tool_response>\nA search for 'w20 w21' found 3 results. ")
  tool_text = gen.tokenizer.decode(traj.segments[2].tokens, skip_special_tokens=False)
  assert tool_text.startswith("<|user|>") and tool_text.endswith("<|assistant|>")
  packed = pack([traj.segments], pad_id=0)
  n = traj.total_tokens()
  mask = packed.loss_mask[0]
  expected = np.concatenate([np.full(len(s.tokens), s.logprobs is not None, np.float32)
                             for s in traj.segments])
  np.testing.assert_array_equal(mask[:n], expected)
  assert mask.sum() == traj.generated_tokens() and mask[n:].sum() == 0
  # the second turn's prompt is exactly the tokens before it
  assert gen.prompts[1] == [int(t) for s in traj.segments[:3] for t in s.tokens]


def test_malformed_call_is_a_counted_format_error_that_ends_the_run():
  bad = '<think>w9</think><tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>'
  gen = scripted({"w40": [bad]})
  [traj] = Executor(gen, fakes.FakeSearcher(), AgentConfig()).run(["w40"], rng=RNG)
  assert traj.answer is None
  assert traj.stats["format_errors"] == 1 and traj.stats["format_error_bad_arguments"] == 1
  assert traj.stats["end_format_error"] == 1 and traj.stats["tool_calls"] == 0
  assert "bad_arguments" in traj.info["turns"][0]["error"]


def test_feedback_mode_shows_the_error_and_continues():
  gen = scripted({"w40": ["w5 w6 no tags", ANSWER]})
  cfg = AgentConfig(on_format_error="feedback")
  [traj] = Executor(gen, fakes.FakeSearcher(), cfg).run(["w40"], rng=RNG)
  assert traj.answer == "w7 w8" and traj.stats["format_errors"] == 1
  assert "was not valid (no_think" in traj.info["messages"][2]["content"]
  assert [s.logprobs is not None for s in traj.segments] == [False, True, False, True]


def test_turn_cap_and_llm_call_cap():
  gen = scripted({"w40": [call(f"w{20 + i}") for i in range(20)]})
  [traj] = Executor(gen, fakes.FakeSearcher(), AgentConfig(max_turns=3)).run(["w40"], rng=RNG)
  assert traj.stats["turns"] == 3 and traj.stats["end_max_turns"] == 1 and traj.answer is None
  # the second run of the episode may only use what is left of max_llm_calls
  ex = Executor(gen, fakes.FakeSearcher(), AgentConfig(max_turns=3, max_llm_calls=4))
  [first] = ex.run(["w40"], rng=RNG)
  [second] = ex.resume([first], ["w33"], rng=RNG)
  assert second.stats["turns"] == 1 and second.stats["llm_calls"] == 4
  assert second.stats["end_max_llm_calls"] == 1


def test_tool_output_is_cut_to_max_tool_tokens():
  gen = scripted({"w40": [call("w20"), ANSWER]})
  cfg = AgentConfig(max_tool_tokens=20)
  [traj] = Executor(gen, fakes.FakeSearcher(words=50), cfg).run(["w40"], rng=RNG)
  out = traj.info["turns"][0]["tool_output"]
  assert out.endswith("(Omitted part of the results returned by the tool)")
  assert traj.stats["tool_outputs_cut"] == 1
  [uncut] = Executor(scripted({"w40": [call("w20"), ANSWER]}), fakes.FakeSearcher(words=50),
                     AgentConfig()).run(["w40"], rng=RNG)
  full = uncut.info["turns"][0]["tool_output"]
  assert "Omitted" not in full
  # the first 20 tokens, less the word-level vocabulary's unknown words (the first 12)
  unk = gen.tokenizer.hf.unk_token_id
  kept = [t for t in gen.tokenizer.encode(full)[:20] if t != unk]
  assert len(kept) == 8 and gen.tokenizer.encode(out.rsplit(" ... (Omitted", 1)[0]) == kept


def test_search_errors_are_counted_and_shown_to_the_model():
  gen = scripted({"w40": [call("w20"), ANSWER], "w41": [call("w21"), ANSWER]})
  searcher = fakes.FakeSearcher(fail=["w21"])
  a, b = Executor(gen, searcher, AgentConfig()).run(["w40", "w41"], rng=RNG)
  assert searcher.calls == [["w20", "w21"], ["w20"], ["w21"]]  # batched, then one by one
  assert a.stats["search_errors"] == 0 and a.info["searches"][0]["passage_ids"]
  assert b.stats["search_errors"] == 1 and b.answer == "w7 w8"
  shown = json.loads(b.info["turns"][0]["tool_output"])
  assert shown["result"].startswith("Search execution failed: server down")


def test_batch_finishes_at_different_turns_with_one_call_per_round():
  script = {"w40": [ANSWER],
            "w41": [call("w20"), ANSWER],
            "w42": [call("w21"), call("w22"), ANSWER],
            "w43": ["garbage"]}
  gen = scripted(script)
  searcher = fakes.FakeSearcher()
  trajs = Executor(gen, searcher, AgentConfig()).run(["w40", "w41", "w42", "w43"], rng=RNG)
  assert [t.stats["turns"] for t in trajs] == [1, 2, 3, 1]
  assert [t.answer for t in trajs] == ["w7 w8", "w7 w8", "w7 w8", None]
  assert gen.calls == [("executor", 4), ("executor", 2), ("executor", 1)]
  assert searcher.calls == [["w20", "w21"], ["w22"]]
  packed = pack([t.segments for t in trajs], pad_id=0)
  assert packed.loss_mask.sum() == sum(t.generated_tokens() for t in trajs)


def test_truncated_turn_ends_the_run_without_running_its_tool_call():
  gen = fakes.ScriptedGenerator(lambda *_: call("w20"), finished=lambda text: False)
  searcher = fakes.FakeSearcher()
  [traj] = Executor(gen, searcher, AgentConfig()).run(["w40"], rng=RNG)
  assert traj.stats["truncated"] == 1 and searcher.calls == []


def test_resume_strips_the_answer_and_adds_the_revised_plan():
  gen = scripted({"w40": [ANSWER, "<think>w9</think><answer>w11</answer>"]})
  ex = Executor(gen, fakes.FakeSearcher(), AgentConfig())
  [first] = ex.run(["w40"], ["w30"], rng=RNG)
  [second] = ex.resume([first], ["w31 w32"], rng=RNG)
  assert second.answer == "w11"
  messages = second.info["messages"]
  assert messages[1] == {"role": "assistant", "content": "<think>w5 w6</think>"}
  assert "I have a revised plan for you to follow:\nw31 w32" in messages[2]["content"]
  assert [s.logprobs is not None for s in second.segments] == [False, True]


@pytest.mark.parametrize("field,value", [("max_turns", 0), ("temperature", -1.0),
                                         ("on_format_error", "retry"),
                                         ("max_queries", 0), ("top_p", 0.0), ("engine", 1),
                                         ("engine_slots", 0)])
def test_config_errors_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    AgentConfig(**{field: value})
