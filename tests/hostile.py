"""Seeded generators of hostile model output for the parser property tests (no hypothesis).

`texts(kind, n, seed)` gives n replies for one parser family: valid replies, then the same
replies mutated (truncated, deeply nested, huge numbers, NaN / Infinity, duplicate keys, odd
unicode, spliced tags, repeated runs), mixed at random. Same seed, same inputs, every run.
"""

from __future__ import annotations

import json
import random

ODD = ["²", "١", "５", "\u200b", "\u202e", "\ufeff", "e\u0301", "\U0001f600", "\x00", "\ud800",
       "\\ud800", "\\u0000", "\r\n", "\t", "ǅ", "ﬁ", "İ", "\u2028", "−"]
NUMBERS = ["1" * 400, "9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e-400",
           "0.0000000001", "-0", "10", "7", "0.7", "1.5", "3/10", "1" * 17 + ".5"]


def _json_values(rng: random.Random, depth: int = 0):
  r = rng.random()
  if depth > 3 or r < 0.3:
    return rng.choice([1, 0.5, "x", True, None, "²", "a}b{", 'q"uote', -3])
  if r < 0.6:
    return [_json_values(rng, depth + 1) for _ in range(rng.randint(0, 3))]
  return {rng.choice(["a", "b", "score", "step"]): _json_values(rng, depth + 1)
          for _ in range(rng.randint(0, 3))}


def _valid(kind: str, rng: random.Random) -> str:
  if kind == "turn":
    if rng.random() < 0.5:
      call = {"name": "search", "arguments": {"query_list": ["capital of France", "²"]}}
      return f"<think>look it up</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return "<think>I know it</think>\n<answer>Paris</answer>"
  if kind == "plan":
    n = rng.randint(1, 4)
    nodes = [{"id": str(i), "title": f"t{i}", "description": "d",
              "depends_on": [str(j) for j in range(i) if rng.random() < 0.5]} for i in range(n)]
    return "Here is the plan:\n```json\n" + json.dumps({"subtasks": nodes}) + "\n```"
  if kind == "skill":
    doc = {"operation": rng.choice(["synthesize", "refine", "create", "skip"]),
           "skill": {"skill_name": "s", "category": "location", "modality": "text-only",
                     "description": "d", "procedure": [{"step": 1, "action": "a",
                                                        "purpose": "p"}],
                     "pitfalls": ["x"], "win_rate": 0.5, "version": 1, "evidence_count": 2},
           "absorbed_ids": [1, "2"]}
    return "<think>hm</think>Sure! " + json.dumps(doc)
  if kind == "score":
    return rng.choice(['{"score": 7, "reason": "ok"}', "- Score: 8\n- Reason: fine",
                       "**Score**: 6/10", "0.7", "Score = 9", "7/10 because", "<think>x</think>5"])
  if kind == "verdict":
    return rng.choice(["A", "**B**.", "Verdict: A", '{"verdict": "B"}', "Final answer: B\nok",
                       "A: CORRECT", "<think>hmm</think>\nCorrect"])
  raise ValueError(kind)


def _mutate(text: str, kind: str, rng: random.Random) -> str:
  op = rng.randrange(14)
  if op == 0:  # truncated
    return text[:rng.randint(0, len(text))]
  if op == 1:  # deeply nested brackets, closed or not
    k, b = rng.choice([200, 1000, 5000]), rng.choice("[{")
    inner = b * k if b == "[" else '{"a":' * k
    close = ("]" if b == "[" else "}") * k if rng.random() < 0.5 else ""
    return text + inner + close if rng.random() < 0.5 else inner + text + close
  if op == 2:  # a huge or non-finite number where a number goes
    num = rng.choice(NUMBERS)
    return rng.choice([text.replace("1", num, 1), text.replace("7", num, 1),
                       f'{{"score": {num}, "step": {num}}}', f"Score: {num}", num,
                       text.replace('"step": 1', f'"step": "{num}"'),
                       text.replace('"step": 1', f'"step": {num}'),
                       text.replace('"win_rate": 0.5', f'"win_rate": {num}')])
  if op == 3:  # duplicate keys
    return text.replace("{", '{"score": 1, "operation": "skip", "id": "0", ', 1)
  if op == 4:  # odd unicode spliced in
    at, odd = rng.randint(0, len(text)), rng.choice(ODD)
    return text[:at] + odd + text[at:]
  if op == 5:  # odd unicode in a step / id / score field
    odd = rng.choice(ODD)
    return (text.replace('"step": 1', f'"step": "{odd}"').replace('"0"', f'"{odd}"')
            .replace("Paris", odd))
  if op == 6:  # tags repeated, nested, crossed
    tag = rng.choice(["think", "answer", "tool_call"])
    return rng.choice([f"<{tag}>{text}</{tag}>", text + f"<{tag}>" * 50,
                       text.replace(f"<{tag}>", f"<{tag}><{tag}>").replace(f"</{tag}>",
                                                                          f"</{tag}></{tag}>"),
                       text.replace("<tool_call>\n", "<tool_call>\n" + "[" * 2000),
                       text.replace("<tool_call>\n", "<tool_call>\n" + '{"a":' * 1500),
                       f"</{tag}>" * 200 + f"<{tag}>" * 200 + text,
                       f"<{tag}><{tag}>x</{tag}></{tag}>", text.replace(">", "><think>", 1)])
  if op == 7:  # a long repeated run of a structural character
    run = rng.choice(["{", "}", "[", '"', "\\", "*", ".", "`", "(", " ", "\n", "9", "/10 ",
                      "score:", "{x}", '{"a":1}'])
    return text + run * rng.choice([100, 2000, 8000]) + rng.choice(["", "x", text])
  if op == 8:  # random JSON values
    return json.dumps(_json_values(rng))
  if op == 9:  # the text doubled with something between
    return text + rng.choice(["", "\n", "}", "{", "```", "</think>"]) + text
  if op == 10:  # fences
    return rng.choice(["```json\n", "```\n", "```"]) + text + rng.choice(["```", ""])
  if op == 11:  # random characters replaced
    chars = list(text)
    for _ in range(rng.randint(1, 5)):
      if chars:
        chars[rng.randrange(len(chars))] = rng.choice('{}[]":,\\ 0-.eNaI²')
    return "".join(chars)
  if op == 12:  # wrong JSON types in known fields
    value = rng.choice(["null", "[]", "{}", "true", '"x"', "-1", "1.5", '[{"step": []}]'])
    for key in ("procedure", "pitfalls", "absorbed_ids", "query_list", "depends_on",
                "subtasks", "skill", "arguments", "id", "title"):
      if rng.random() < 0.3:
        text = text.replace(f'"{key}": ', f'"{key}": {value}, "_": ', 1)
    return text
  return text[rng.randint(0, len(text)):] + text[:rng.randint(0, len(text))]  # rotated


def texts(kind: str, n: int, seed: int = 0) -> list[str]:
  """n replies of one family ('turn', 'plan', 'skill', 'score', 'verdict'), 1 in 8 unmutated,
  the rest mutated one to three times."""
  rng = random.Random(f"{kind}-{seed}")
  out = []
  for i in range(n):
    text = _valid(kind, rng)
    # a turn keeps its <think> block half the time, so the mutations reach the action parser
    head, text = (text.split("\n", 1) if kind == "turn" and rng.random() < 0.5 else ("", text))
    if i % 8:
      for _ in range(rng.randint(1, 3)):
        text = _mutate(text, kind, rng)
    out.append(head + "\n" + text if head else text)
  return out


def chain(n: int, cycle: bool = False) -> list[dict]:
  """A plan whose nodes form a chain 0 <- 1 <- ... <- n-1 (a cycle when the first depends on the
  last)."""
  nodes = [{"id": str(i), "title": "t", "description": "d",
            "depends_on": [str(i - 1)] if i else []} for i in range(n)]
  if cycle:
    nodes[0]["depends_on"] = [str(n - 1)]
  return nodes
