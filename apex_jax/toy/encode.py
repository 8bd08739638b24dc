"""Token encoding of multi-turn conversations (`apex_jax.toy.corpus`) for supervised training, built
the way the agents build a chat at run time (`apex_jax.agents.conversation`): the opening chat
rendered with the generation prompt, each reply as its own tokens then <|im_end|>, each later
message as a chat-template delta (no newline after a generated <|im_end|>, as when sampling).

The loss mask is 1 on every reply and its <|im_end|>, 0 on prompts, tool outputs and follow-ups:
  loss = sum_t mask_t * -log p(x_t | x_<t) / sum_t mask_t.
A turn without rounds encodes exactly as `morse_jax.toy.sft.encode` does, so MoRSE turns and
APEx conversations share one encoder. With a VL chat tokenizer (`agents.vl_generator`), a turn's
"images" (the vision toy's drills) make its `<image>` markers image blocks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from apex_jax.agents.conversation import ChatDeltas, chat_ids, markers
from morse_jax import llm
from morse_jax.toy import tokenizer as toy_tokenizer


def _wrap(tok) -> llm.Tokenizer:
  return tok if isinstance(tok, llm.Tokenizer) else llm.Tokenizer(tok, "<toy tokenizer>")


def encode_rounds(turn: dict[str, Any], tok, deltas: ChatDeltas | None = None
                  ) -> tuple[np.ndarray, np.ndarray, list[int]]:
  """(tokens [n], loss_mask [n], the end position of each reply, its <|im_end|> included)."""
  vl = getattr(tok, "takes_images", False)  # a VlChatTokenizer: the turn's markers are images
  tok = tok if vl else _wrap(tok)
  im_end = (tok.base if vl else tok).hf.convert_tokens_to_ids(toy_tokenizer.IM_END)
  shown = (lambda messages: markers(messages)) if vl and turn.get("images") else (lambda _: 0)
  tokens = chat_ids(tok, list(turn["messages"]), shown(turn["messages"]))
  mask, ends = [0.0] * len(tokens), []
  rounds = [([], turn["target"])] + [(r["messages"], r["target"]) for r in turn.get("rounds", ())]
  for i, (messages, target) in enumerate(rounds):
    if i:
      deltas = deltas or ChatDeltas(tok)
      ids = deltas(messages, shown(messages))
      tokens += ids
      mask += [0.0] * len(ids)
    reply = tok.encode(target) + [im_end]
    tokens += reply
    mask += [1.0] * len(reply)
    ends.append(len(tokens))
  return np.asarray(tokens, np.int32), np.asarray(mask, np.float32), ends


def encode(turn: dict[str, Any], tok, max_len: int,
           deltas: ChatDeltas | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [n], loss_mask [n]) with n <= max_len (longer conversations are cut)."""
  tokens, mask, _ = encode_rounds(turn, tok, deltas)
  return tokens[:max_len], mask[:max_len]


def examples(turns: Sequence[dict[str, Any]], tok, max_len: int, cut_rounds: bool = True):
  """(encoded turns, dropped, cut): a conversation longer than max_len is cut after its last
  reply that fits whole (cut_rounds; the replies before it are complete examples of their
  turns), else dropped, as is a single-turn one (its reply would be partial)."""
  tok = tok if getattr(tok, "takes_images", False) else _wrap(tok)
  deltas = ChatDeltas(tok)
  out, dropped, cut = [], 0, 0
  for turn in turns:
    got, was_cut = example(turn, tok, max_len, deltas, cut_rounds)
    if got is None:
      dropped += 1
    else:
      out.append(got)
      cut += was_cut
  return out, dropped, cut


def example(turn: dict[str, Any], tok, max_len: int, deltas: ChatDeltas,
            cut_rounds: bool = True) -> tuple[tuple[np.ndarray, np.ndarray] | None, bool]:
  """One conversation as `examples` encodes it: ((tokens, mask) or None when dropped, whether it
  was cut). tok: as `examples` passes it (wrapped, or a VL chat tokenizer)."""
  tokens, mask, ends = encode_rounds(turn, tok, deltas)
  if len(tokens) <= max_len:
    return (tokens, mask), False
  fit = [e for e in ends if e <= max_len] if cut_rounds else []
  if not fit:
    return None, False
  return (tokens[:fit[-1]], mask[:fit[-1]]), True


def texts(turns: Sequence[dict[str, Any]]) -> list[str]:
  """Every message and reply string, to train a tokenizer on."""
  out = []
  for t in turns:
    out.extend(m["content"] for m in t["messages"])
    out.append(t["target"])
    for r in t.get("rounds", ()):
      out.extend(m["content"] for m in r["messages"])
      out.append(r["target"])
  return out
