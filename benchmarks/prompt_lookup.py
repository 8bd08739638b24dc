"""Would prompt-lookup speculative decoding help the chat server's ragged tail? Its acceptance,
measured on the server benchmark's own replies before anyone builds it.

  python -m benchmarks.prompt_lookup --model=smollm2 --out=FILE

The replies of `benchmarks.serve_ragged`'s requests (its prompts, its stop-less model, greedy, on
the engine) are generated once; then, token by token, the draft prompt lookup would propose
(vLLM's `ngram` method: the continuation after the latest earlier occurrence of the context's
last n tokens, n from --max_ngram down to 1, over prompt and reply) is checked against what the
model did emit. A verify pass over 1 + k tokens emits 1 + the drafts that match in order, so
`tokens_per_verify` is what speculation could gain per weight read at most (1.0: nothing). Under
a ragged load the tail's steps carry few rows and cost about one weight read each: speculation
pays there only if this is well above 1.
"""

from __future__ import annotations

from absl import app, flags

from apex_jax.judges import InProcessChat
from benchmarks.common import bench_model, write_report

def draft(context: list[int], k: int, max_ngram: int) -> list[int]:
  """Prompt lookup: the k tokens after the latest earlier occurrence of the context's last n
  tokens (the longest n that occurs), or none."""
  for n in range(max_ngram, 0, -1):
    if len(context) <= n:
      continue
    tail = context[-n:]
    for start in range(len(context) - n - 1, -1, -1):
      if context[start:start + n] == tail:
        return context[start + n:start + n + k]
  return []


def verifies(prompt: list[int], reply: list[int], k: int, max_ngram: int) -> int:
  """Verify passes a greedy reply takes with k-token drafts: each pass emits the model's next
  token and then every draft token that matches the reply in order."""
  context, i, passes = list(prompt), 0, 0
  while i < len(reply):
    guess = draft(context, k + 1, max_ngram)  # guess[0] is the next token's draft
    emitted = 1
    if guess and guess[0] == reply[i]:
      for token in guess[1:]:
        if i + emitted < len(reply) and token == reply[i + emitted]:
          emitted += 1
        else:
          break
    context += reply[i:i + emitted]
    i += emitted
    passes += 1
  return passes


def main(_):
  import dataclasses

  from morse_jax.llm.engine import Engine, EngineConfig, Request

  f = flags.FLAGS
  model = dataclasses.replace(bench_model(f.model), stop_ids=())  # as serve_ragged serves it
  chat = InProcessChat(model, max_context=1024)
  prompts = [chat.prompt_tokens([{"role": "user", "content":
                                  f"Tell me story number {i} about a lighthouse."}])
             for i in f.story]
  engine = Engine(model, EngineConfig(slots=len(prompts), max_len=1024))
  handles = [engine.submit(Request(prompt=p, max_new_tokens=f.max_tokens, stop_ids=()))
             for p in prompts]
  while not all(h.done for h in handles):
    engine.step()
  replies = [list(map(int, h.tokens)) for h in handles]
  rows = {}
  for k in f.drafts:
    passes = [verifies(p, r, k, f.max_ngram) for p, r in zip(prompts, replies)]
    tokens = sum(map(len, replies))
    rows[str(k)] = {"verify_passes": passes, "tokens": tokens,
                    "tokens_per_verify": tokens / sum(passes)}
    print(f"k={k}: {tokens} tokens in {sum(passes)} verify passes = "
          f"{tokens / sum(passes):.3f} tokens per pass", flush=True)
  write_report("prompt_lookup", f.out, model=f.model, stories=f.story,
               max_tokens=f.max_tokens, max_ngram=f.max_ngram, drafts=rows)


if __name__ == "__main__":
  # flags defined here, not at import: the tests import this module beside launchers that
  # define --model too (absl flags are process-wide)
  flags.DEFINE_string("model", "tiny", "tiny, smollm2, or a Hugging Face folder.")
  flags.DEFINE_multi_integer("story", [0, 7, 15, 31], "serve_ragged's story numbers.")
  flags.DEFINE_integer("max_tokens", 480, "Tokens per reply (serve_ragged's longest).")
  flags.DEFINE_multi_integer("drafts", [3, 5, 7], "Draft lengths k to score.")
  flags.DEFINE_integer("max_ngram", 3, "Longest n-gram looked up.")
  flags.DEFINE_string("out", None, "Write the report as JSON to this file.")
  app.run(main)
