"""Parsing the executor's turns: one tool call or one answer after the think block."""

import json

import pytest

from apex_jax.tools import Answer, FormatError, ToolCall, parse_turn, render_tool_call
from apex_jax.tools.protocol import FORMAT_ERRORS

THINK = "<think>I need the director's birthplace.</think>\n"


def call(payload) -> str:
  text = payload if isinstance(payload, str) else json.dumps(payload)
  return f"{THINK}<tool_call>\n{text}\n</tool_call>"


def search(*queries):
  return {"name": "search", "arguments": {"query_list": list(queries)}}


def test_search_call():
  out = parse_turn(call(search("Titanic director", "James Cameron birthplace")))
  assert out == ToolCall("search", {"query_list": ["Titanic director", "James Cameron birthplace"]},
                         "I need the director's birthplace.")
  assert out.queries == ["Titanic director", "James Cameron birthplace"]


def test_rendered_call_parses_back():
  out = parse_turn(THINK + render_tool_call(["a", "b"]))
  assert isinstance(out, ToolCall) and out.queries == ["a", "b"]


def test_answer():
  out = parse_turn(f"{THINK}<answer> Kapuskasing, Ontario </answer>")
  assert out == Answer("Kapuskasing, Ontario", "I need the director's birthplace.")


def test_tags_inside_think_are_not_actions():
  text = "<think>I could write <answer>x</answer> but should search.</think>" + \
      "<tool_call>" + json.dumps(search("q")) + "</tool_call>"
  assert isinstance(parse_turn(text), ToolCall)


def test_image_search_tool_when_enabled():
  payload = {"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}
  assert parse_turn(call(payload)).code == "unknown_tool"  # text-only executor: search only
  tools = ("search", "web_image_to_image_search")
  assert isinstance(parse_turn(call(payload), tools=tools), ToolCall)
  bad = {"name": "web_image_to_image_search", "arguments": {"img_idx": 1}}
  assert parse_turn(call(bad), tools=tools).code == "bad_arguments"


def test_think_is_optional_when_not_required():
  assert parse_turn("<answer>4</answer>", require_think=False) == Answer("4")
  assert parse_turn("<answer>4</answer>").code == "no_think"


FAILURES = [
    ("<answer>4</answer>", "no_think", "no <think>"),
    ("Sure! <think>x</think><answer>4</answer>", "no_think", "text before <think>"),
    ("<think>a</think><think>b</think><answer>4</answer>", "multiple_think", "2 <think>"),
    ("<think>a<answer>4</answer>", "unbalanced_tags", "<think> opened 1 time(s), closed 0"),
    (THINK + "I will search now.", "no_action", "neither"),
    (THINK + "<tool_call>" + json.dumps(search("q")), "unbalanced_tags", "<tool_call> opened 1"),
    (call(search("q")) + "<answer>4</answer>", "tool_call_and_answer", "both"),
    (call(search("a")) + "<tool_call>" + json.dumps(search("b")) + "</tool_call>",
     "multiple_tool_calls", "2 <tool_call>"),
    (THINK + "<answer>4</answer><answer>5</answer>", "multiple_answers", "2 <answer>"),
    (THINK + "<answer>  </answer>", "empty_answer", "empty"),
    (call('{"name": "search", "arguments": {"query_list": ["a"]'), "invalid_json",
     "not valid JSON"),
    (call("{'name': 'search'}"), "invalid_json", "not valid JSON"),
    (call('["search", ["a"]]'), "not_an_object", "got [\"search\""),
    (call({"name": "search"}), "bad_tool_call", "lacks ['arguments']"),
    (call({"arguments": {"query_list": ["a"]}}), "bad_tool_call", "lacks ['name']"),
    (call({"name": "web_search", "arguments": {"query_list": ["a"]}}), "unknown_tool",
     'unknown tool name "web_search"'),
    (call({"name": 3, "arguments": {}}), "unknown_tool", "unknown tool name 3"),
    (call({"name": "search", "arguments": '{"query_list": ["a"]}'}), "bad_arguments",
     "'arguments' must be an object"),
    (call({"name": "search", "arguments": {"query": "a"}}), "bad_arguments",
     "exactly the key 'query_list'"),
    (call({"name": "search", "arguments": {"query_list": ["a"], "topk": 3}}), "bad_arguments",
     "exactly the key 'query_list'"),
    (call({"name": "search", "arguments": {"query_list": "a"}}), "bad_arguments",
     "must be a list of strings"),
    (call(search()), "bad_arguments", "'query_list' is empty"),
    (call({"name": "search", "arguments": {"query_list": ["a", 2]}}), "bad_arguments",
     "query_list[1] must be a non-empty string, got 2"),
    (call(search("a", "   ")), "bad_arguments", "query_list[1] must be a non-empty string"),
]


@pytest.mark.parametrize("text,code,message", FAILURES)
def test_format_errors_name_what_is_wrong(text, code, message):
  out = parse_turn(text)
  assert isinstance(out, FormatError), out
  assert out.code == code and message in out.message, out


def test_every_error_code_is_exercised():
  # repeated_image_search is the executor's (one turn cannot show it): test_executor_images
  assert {code for _, code, _ in FAILURES} == set(FORMAT_ERRORS) - {"repeated_image_search"}


def test_max_queries():
  text = call(search("a", "b", "c"))
  assert isinstance(parse_turn(text, max_queries=3), ToolCall)
  out = parse_turn(text, max_queries=2)
  assert out.code == "bad_arguments" and "3 queries; at most 2" in out.message


def test_format_error_codes_are_checked():
  with pytest.raises(ValueError, match="unknown format error code"):
    FormatError("oops", "x")
