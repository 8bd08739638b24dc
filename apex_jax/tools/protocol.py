"""The executor's turn format: `<think>...</think>` then exactly one of
`<tool_call>{"name": "search", "arguments": {"query_list": [...]}}</tool_call>` or
`<answer>...</answer>`.

The tool-call JSON and its checks follow the APEx authors' executor (J-Ding519/APEx
Executor-Train/Train/local_search/mmsearch.py `compute_score`: the tool name must be a known tool,
`search` arguments must have exactly the key `query_list`, a non-empty list of non-blank strings;
`web_image_to_image_search` takes `{"img_idx": "0"}`; the schema is in
Executor-Train/Train/local_search/configs/mm_search_tool_config.yaml). Model output is never
trusted: `parse_turn` returns a `FormatError` naming what is wrong instead of raising.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable, Sequence

from morse_jax import jsonsafe

FORMAT_ERRORS = ("no_think", "multiple_think", "unbalanced_tags", "no_action",
                 "tool_call_and_answer", "multiple_tool_calls", "multiple_answers",
                 "invalid_json", "not_an_object", "bad_tool_call", "unknown_tool",
                 "bad_arguments", "empty_answer",
                 # the executor's: web_image_to_image_search a second time in an episode
                 "repeated_image_search")


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: dict
  think: str = ""

  @property
  def queries(self) -> list[str]:
    """The `search` call's query_list."""
    return list(self.arguments["query_list"])


@dataclasses.dataclass(frozen=True)
class Answer:
  text: str
  think: str = ""


@dataclasses.dataclass(frozen=True)
class FormatError:
  code: str  # one of FORMAT_ERRORS
  message: str

  def __post_init__(self):
    if self.code not in FORMAT_ERRORS:
      raise ValueError(f"unknown format error code {self.code!r}")

  def __str__(self) -> str:
    return f"{self.code}: {self.message}"


def _short(value, limit: int = 60) -> str:
  text = json.dumps(value, ensure_ascii=False)
  return text if len(text) <= limit else text[:limit] + "..."


def check_search(arguments: dict) -> str | None:
  if set(arguments) != {"query_list"}:
    return f"search takes exactly the key 'query_list', got keys {sorted(arguments)}"
  queries = arguments["query_list"]
  if not isinstance(queries, list):
    return f"'query_list' must be a list of strings, got {_short(queries)}"
  if not queries:
    return "'query_list' is empty"
  for i, q in enumerate(queries):
    if not isinstance(q, str) or not q.strip():
      return f"query_list[{i}] must be a non-empty string, got {_short(q)}"
  return None


def check_image_search(arguments: dict) -> str | None:
  if arguments != {"img_idx": "0"}:
    return f"web_image_to_image_search takes {{\"img_idx\": \"0\"}}, got {_short(arguments)}"
  return None


# name -> argument check (None when valid, else the reason)
TOOL_CHECKS: dict[str, Callable[[dict], str | None]] = {
    "search": check_search,
    "web_image_to_image_search": check_image_search,
}

_BLOCK = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)
          for tag in ("think", "tool_call", "answer")}


_TAG = re.compile(r"<(/?)(think|tool_call|answer)>")


def _unbalanced(text: str, tags: Sequence[str]) -> FormatError | None:
  """A FormatError unless each of `tags` opens and closes in turn (<a>..</a><a>..</a>): counts
  that differ, a close before its open, or a block nested in one of its own kind
  (`<answer><answer>x</answer></answer>`, which a non-greedy match would read as '<answer>x').
  One pass over the tags, so the block matches that follow stay linear."""
  for tag in tags:
    opened, closed = text.count(f"<{tag}>"), text.count(f"</{tag}>")
    if opened != closed:
      return FormatError("unbalanced_tags", f"<{tag}> opened {opened} time(s), closed {closed}")
  open_ = dict.fromkeys(tags, False)
  for m in _TAG.finditer(text):
    closing, tag = m.group(1) == "/", m.group(2)
    if tag not in open_:
      continue
    if open_[tag] == (not closing):
      what = f"<{tag}> inside <{tag}>" if not closing else f"</{tag}> before its <{tag}>"
      return FormatError("unbalanced_tags", f"{what} at char {m.start()}")
    open_[tag] = not closing
  return None


def parse_turn(text: str, tools: Sequence[str] = ("search",), require_think: bool = True,
               max_queries: int | None = None) -> ToolCall | Answer | FormatError:
  """One assistant turn -> ToolCall, Answer or FormatError.

  Tags inside the think block are not actions (a model may think about `<answer>`); text
  between `</think>` and the action, or after it, is ignored, as the authors' reward does."""
  error = _unbalanced(text, ["think"])
  if error:
    return error
  thinks = list(_BLOCK["think"].finditer(text))
  if len(thinks) > 1:
    return FormatError("multiple_think", f"{len(thinks)} <think> blocks; one per turn")
  if thinks and text[:thinks[0].start()].strip():
    return FormatError("no_think", "text before <think>: the turn must begin with it")
  if not thinks and require_think:
    return FormatError("no_think", "no <think>...</think> block")
  think = thinks[0].group(1).strip() if thinks else ""
  rest = text[thinks[0].end():] if thinks else text
  error = _unbalanced(rest, ["tool_call", "answer"])
  if error:
    return error
  calls, answers = _BLOCK["tool_call"].findall(rest), _BLOCK["answer"].findall(rest)
  if calls and answers:
    return FormatError("tool_call_and_answer", "both <tool_call> and <answer>; give one")
  if len(calls) > 1:
    return FormatError("multiple_tool_calls", f"{len(calls)} <tool_call> blocks; one per turn")
  if len(answers) > 1:
    return FormatError("multiple_answers", f"{len(answers)} <answer> blocks; one per turn")
  if answers:
    answer = answers[0].strip()
    if not answer:
      return FormatError("empty_answer", "<answer></answer> is empty")
    return Answer(answer, think)
  if not calls:
    return FormatError("no_action", "neither <tool_call>...</tool_call> nor <answer>...</answer>")
  return _parse_call(calls[0], think, tools, max_queries)


def parse_tool_call(payload: str, tools: Sequence[str] = tuple(TOOL_CHECKS),
                    max_queries: int | None = None) -> ToolCall | FormatError:
  """The JSON between <tool_call> and </tool_call> -> ToolCall when it names one of `tools` with
  arguments that pass its check (`TOOL_CHECKS`), else the FormatError saying why. The
  executor's reward counts only such valid calls as tool use (rewards.executor_checks)."""
  return _parse_call(payload, "", tools, max_queries)


def _parse_call(payload: str, think: str, tools: Sequence[str],
                max_queries: int | None) -> ToolCall | FormatError:
  try:
    call = jsonsafe.loads(payload.strip())
  except json.JSONDecodeError as e:  # also too deep, NaN, an integer too long (jsonsafe)
    return FormatError("invalid_json", f"tool call is not valid JSON: {e.msg} at column "
                                       f"{e.colno}: {payload.strip()[:80]!r}")
  if not isinstance(call, dict):
    return FormatError("not_an_object", f"tool call must be a JSON object, got {_short(call)}")
  missing = [key for key in ("name", "arguments") if key not in call]
  if missing:
    return FormatError("bad_tool_call", f"tool call lacks {missing}; expected "
                                        '{"name": ..., "arguments": {...}}')
  name, arguments = call["name"], call["arguments"]
  if not isinstance(name, str) or name not in tools:
    return FormatError("unknown_tool", f"unknown tool name {_short(name)}; known: {list(tools)}")
  if not isinstance(arguments, dict):
    return FormatError("bad_arguments", f"'arguments' must be an object, got {_short(arguments)}")
  check = TOOL_CHECKS.get(name)
  reason = check(arguments) if check else None
  if reason is None and name == "search" and max_queries and len(arguments["query_list"]) > \
      max_queries:
    reason = f"{len(arguments['query_list'])} queries; at most {max_queries}"
  if reason:
    return FormatError("bad_arguments", reason)
  return ToolCall(name, arguments, think)


def render_tool_call(queries: Sequence[str]) -> str:
  """The search call as the executor writes it (for prompts, few-shot examples and tests)."""
  payload = {"name": "search", "arguments": {"query_list": list(queries)}}
  return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"
