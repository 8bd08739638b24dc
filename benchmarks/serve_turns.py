"""The chat server's prefix cache under multi-turn chats: each turn resends the whole history.

  python -m benchmarks.serve_turns --model=smollm2 --out=FILE

`--chats` concurrent greedy conversations of `--turns` turns each (a user message, then the
model's reply of `--max_tokens`, sent back with the next message as chat clients do) run on one
server with `ChatLimits.prefix_cache` and on one without, alternately (`--repeats`), in this
process. Reported per server: wall seconds of the whole load, prompt tokens sent, prompt tokens the
engine prefilled (`prefill_tokens`) and the cache's page hits; `seconds_ratio` (without / with)
and `prefilled_share` (prefilled / sent, with the cache). The replies of both servers are compared
(`replies_equal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from absl import app, flags

from apex_jax.judges import InProcessChat, serving
from apex_jax.judges.protocol import ChatLimits
from apex_jax.tools.server import running
from benchmarks.common import bench_model, greedy_chat, threads_seconds, write_report

_MODEL = flags.DEFINE_string("model", "tiny", "tiny, smollm2, or a Hugging Face folder.")
_CHATS = flags.DEFINE_integer("chats", 8, "Concurrent conversations.")
_TURNS = flags.DEFINE_integer("turns", 4, "Turns per conversation.")
_MAX = flags.DEFINE_integer("max_tokens", 64, "Tokens per reply.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs per server, alternating; the fastest kept.")
_OUT = flags.DEFINE_string("out", None, "Write the report as JSON to this file.")


def chat_turn(url: str, messages: list[dict], max_tokens: int) -> tuple[str, int]:
  """(the reply's text, the prompt tokens the server counted)."""
  out = greedy_chat(url, messages, max_tokens)
  return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens"]


def conversations(url: str, chats: int, turns: int, max_tokens: int, first: int = 0) -> dict:
  """`chats` conversations at once, numbered from `first` (each run its own: a replayed one
  would find its whole history cached)."""
  replies = [[] for _ in range(chats)]
  sent = [0] * chats
  errors = []

  def one(i):
    messages = []
    try:
      for t in range(turns):
        messages.append({"role": "user", "content": f"Chat {first + i}, question {t}: tell me "
                                                    f"more about lighthouse number {i + t}."})
        text, prompt_tokens = chat_turn(url, messages, max_tokens)
        messages.append({"role": "assistant", "content": text})
        replies[i].append(text)
        sent[i] += prompt_tokens
    except Exception as e:  # noqa: BLE001 -- reported after the load
      errors.append(e)

  wall = threads_seconds([threading.Thread(target=one, args=(i,)) for i in range(chats)])
  if errors:
    raise errors[0]
  return {"seconds": wall, "prompt_tokens_sent": sum(sent), "replies": replies}


def main(_):
  model = dataclasses.replace(bench_model(_MODEL.value), stop_ids=())  # replies run to budget
  servers = {}
  for cache in (True, False):
    limits = ChatLimits(max_tokens=_MAX.value, max_batch=_CHATS.value, prefix_cache=cache)
    chat = InProcessChat(model, max_context=min(2048, model.config.max_position_embeddings))
    servers[cache] = (serving.make_server(chat, _MODEL.value, port=0, default_max_tokens=8,
                                          limits=limits), chat)
  runs = {True: [], False: []}
  with contextlib.ExitStack() as stack:
    for srv, _ in servers.values():
      stack.enter_context(running(srv))
    for cache in (True, False):  # warm-up: the programs either load compiles
      conversations(servers[cache][0].url, _CHATS.value, _TURNS.value, _MAX.value)
    for k in range(1, _REPEATS.value + 1):
      for cache in (True, False):
        srv, chat = servers[cache]
        engine, _ = srv.batcher.engine(chat)
        before = dict(engine.stats)
        run = conversations(srv.url, _CHATS.value, _TURNS.value, _MAX.value, k * _CHATS.value)
        for key in ("prefill_tokens", "prefix_pages_hit", "prefill_calls", "decode_calls"):
          run[key] = engine.stats[key] - before.get(key, 0)
        runs[cache].append(run)
        print(f"prefix_cache={cache}: {run['seconds']:.1f} s, {run['prompt_tokens_sent']} prompt "
              f"tokens sent, {run['prefill_tokens']} prefilled", flush=True)
  best = {cache: min(r, key=lambda x: x["seconds"]) for cache, r in runs.items()}
  equal = all(a["replies"] == b["replies"] for a, b in zip(runs[True], runs[False]))
  report = {name: {k: v for k, v in best[cache].items() if k != "replies"}
            for name, cache in (("with_cache", True), ("without_cache", False))}
  ratio = best[False]["seconds"] / best[True]["seconds"]
  share = best[True]["prefill_tokens"] / best[True]["prompt_tokens_sent"]
  print(f"seconds without / with: {ratio:.3f}; prefilled share with the cache: {share:.3f}; "
        f"replies equal: {equal}")
  write_report("serve_turns", _OUT.value, model=_MODEL.value, chats=_CHATS.value,
               turns=_TURNS.value, max_tokens=_MAX.value, **report, seconds_ratio=ratio,
               prefilled_share=share, replies_equal=equal,
               runs={str(k): [{x: y for x, y in r.items() if x != "replies"} for r in v]
                     for k, v in runs.items()})


if __name__ == "__main__":
  app.run(main)
