"""Training encodes exactly the chat the real agents build (replies trained, tool output and
prompts not), and the compact prompts are shorter than the authors'."""

import jax
import numpy as np
import pytest

from apex_jax.agents import AgentConfig, AgentConfigError, Executor, Planner, prompts
from apex_jax.agents.generator import Generation
from apex_jax.memory.records import Memory
from apex_jax.toy import encode
from apex_jax.tools.overlap import WordSearch
from morse_jax.toy import sft

RNG = jax.random.key(0)


class Replay:
  """A generator that replies with a fixed list of texts, one per call (one prompt each)."""

  def __init__(self, tok, replies):
    self.tokenizer, self.replies, self.prompts = tok, list(replies), []

  def tokenizer_of(self, module):
    return self.tokenizer

  def generate(self, module, prompts, *, rng, max_new_tokens, sampling):
    assert len(prompts) == 1
    self.prompts.append(list(prompts[0]))
    text = self.replies.pop(0)
    ids = self.tokenizer.encode(text) + [self.tokenizer.hf.convert_tokens_to_ids("<|im_end|>")]
    return [Generation(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), text)]


def _replies(turn):
  return [turn["target"]] + [r["target"] for r in turn["rounds"]]


def _chat(turn):
  out = list(turn["messages"])
  for i, reply in enumerate(_replies(turn)):
    out += (turn["rounds"][i - 1]["messages"] if i else []) + [
        {"role": "assistant", "content": reply}]
  return out


@pytest.mark.parametrize("style", ["authors", "compact"])
def test_real_executor_and_planner_build_the_corpus_chats(style, authors, compact, world,
                                                          toy_tok):
  """The real Executor, replaying the corpus's replies over the same search, makes the same
  messages and the same tokens; the real Planner makes the same planner chats."""
  turns, _ = authors if style == "authors" else compact
  config = AgentConfig(prompts=style)
  guide = prompts.PLAN_GUIDE if style == "authors" else prompts.COMPACT_PLAN_GUIDE
  head, tail = guide.split("{plan}")
  by_id = {e.id: e for e in world.examples}
  searcher = WordSearch(world.passages, config.topk)
  ex_turns = [t for t in turns if t["role"] == "apex_execute"][:4]
  for turn in ex_turns:
    gen = Replay(toy_tok, _replies(turn))
    plan = turn["messages"][0]["content"].partition(head)[2]
    plan = plan[:-len(tail)] if plan else None
    (traj,) = Executor(gen, searcher, config).run([by_id[turn["example_id"]].question], [plan],
                                                  rng=RNG)
    assert traj.info["messages"] == _chat(turn)
    tokens, mask = encode.encode(turn, toy_tok, 10 ** 6)
    assert list(tokens) == [int(t) for s in traj.segments for t in s.tokens]
    trained = np.concatenate([np.full(len(s.tokens), s.logprobs is not None) for s in
                              traj.segments])
    assert (mask == trained).all()
  for turn in [t for t in turns if t["role"] == "apex_plan"][:4]:
    example = by_id[turn["example_id"]]
    planner = Planner(Replay(toy_tok, _replies(turn)), config)
    (run,) = planner.plan([example.question], [None], rng=RNG)
    judge = turn["rounds"][0]["messages"][0]["content"]
    fake = type("T", (), {"info": {"turns": _trace_turns(judge, example.question, style)}})()
    planner.evaluate([run], [fake], rng=RNG)
    if turn["replan"]:
      planner.replan([run], [None], rng=RNG)
    assert run.conv.messages == _chat(turn)


def _trace_turns(judge_text, question, style):
  """The executor turns back from a rendered judge prompt (render_trace's layout)."""
  if style == "authors":
    trace, words = judge_text[1:judge_text.index("\n\nBased on the sufficiency")], 512
  else:
    trace, words = judge_text[:judge_text.index("\nReplan? Reply yes")], prompts.COMPACT_TRACE_WORDS
  turns = []
  for part in trace.split("### Round ")[1:]:
    body = part.split("#### Agent Reasoning and Tool Call:\n", 1)[1]
    text, _, tool = body.partition("\n#### Tool Call Return Results:\n")
    turns.append({"text": text.rstrip("\n") if not tool else text,
                  "tool_output": tool.rstrip("\n") if tool else None})
  assert prompts.render_trace(question, turns, words) == trace
  return turns


def test_mask_trains_replies_only(compact, toy_tok):
  for turn in compact[0][:40]:
    tokens, mask = encode.encode(turn, toy_tok, 10 ** 6)
    trained = toy_tok.decode([int(t) for t, m in zip(tokens, mask) if m],
                             skip_special_tokens=False)
    assert trained == "".join(r + "<|im_end|>" for r in _replies(turn))
    assert "<tool_response>" not in trained
    rest = toy_tok.decode([int(t) for t, m in zip(tokens, mask) if not m],
                          skip_special_tokens=False)
    for r in turn["rounds"]:
      assert r["messages"][0]["content"] in rest


def test_single_turn_encodes_as_sft_and_long_ones_are_cut_at_a_reply(compact, toy_tok):
  single = {"messages": [{"role": "user", "content": "Write f."}], "target": "def f(): pass"}
  for a, b in zip(encode.encode(single, toy_tok, 64), sft.encode(single, toy_tok.hf, 64)):
    np.testing.assert_array_equal(a, b)
  turn = max((t for t in compact[0] if t["role"] == "apex_execute"), key=lambda t: len(t["rounds"]))
  tokens, _, ends = encode.encode_rounds(turn, toy_tok)
  data, dropped, cut = encode.examples([turn, single], toy_tok, ends[1] + 1)
  assert (dropped, cut) == (0, 1) and len(data[0][0]) == ends[1]
  data, dropped, cut = encode.examples([single], toy_tok, 4)
  assert (len(data), dropped, cut) == (0, 1, 0)


def _count(tok, messages):
  return len(tok.apply_chat_template(messages, add_generation_prompt=True))


def test_compact_prompts_shorter_with_the_same_protocol(toy_tok):
  q = "In which country was the director of the film Minma born?"
  memory = "### Retrieved Relevant Memories:\nNone found."
  batch = [Memory(3, "location", "text-only", q, "1. search(\"Minma film director\")",
                  "correct")]
  pairs = {}
  for style in prompts.STYLES:
    pairs[style] = [
        prompts.executor_messages(q, "1. Search.", style),
        prompts.plan_messages(prompts.NO_SKILL, memory, q, 400, style),
        [prompts.judge_message(q, [{"text": "<answer>x</answer>", "tool_output": None}], style)],
        [prompts.replan_message(q, None, 200, style)]]
  pairs["authors"].append(prompts.skill_messages(("location", "text-only"), batch, None))
  pairs["compact"].append(prompts.skill_chat("location", "text-only", "m", None, "compact"))
  for authors_msgs, compact_msgs in zip(pairs["authors"], pairs["compact"]):
    assert _count(toy_tok, compact_msgs) < 0.4 * _count(toy_tok, authors_msgs)
  executor = pairs["compact"][0][0]["content"]
  for tag in ("<think>", "<tool_call>", '"query_list"', "<answer>", q, "1. Search."):
    assert tag in executor
  assert "yes or no" in pairs["compact"][2][0]["content"]
  assert '"absorbed_ids"' in pairs["compact"][4][1]["content"]


def test_agent_config_checks_prompts():
  assert AgentConfig().prompts == "authors"
  with pytest.raises(AgentConfigError, match="AgentConfig.prompts 'short'"):
    AgentConfig(prompts="short")
  with pytest.raises(ValueError, match="prompt style 'x'"):
    prompts.executor_messages("q", None, "x")
