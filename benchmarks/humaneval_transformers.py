"""The single-agent HumanEval evaluation with transformers' `generate` in place of our sampler.

  python -m benchmarks.humaneval_transformers --ours=RUN/eval_test.jsonl --out=FILE.json \
      [--model=DIR] [--max_new_tokens=512] [--limit=0] [--skip=0] [--batch=32]

The prompts are the ones `launchers.evaluate --config=configs/morse/humaneval.py:single,...`
builds (the same prompt builder, chat template and stop ids), decoded greedily by transformers
from the same folder and scored by the same verifier. With `--ours` (the JSONL of our run, one
line per node) it reports, per problem, whether both replies are equal and both pass@1 values:
the claim tested is that our sampler changes nothing about what the model writes.
"""

from __future__ import annotations

import json
import os
import time
import types

from absl import app, flags

from benchmarks.common import single_agent_prompts, write_report

_MODEL = flags.DEFINE_string("model", "~/.cache/morse_jax/models/SmolLM2-135M-Instruct",
                             "Hugging Face folder (make real-model writes the default).")
_OURS = flags.DEFINE_string("ours", None, "eval_<split>.jsonl of our run on the same settings.")
_OUT = flags.DEFINE_string("out", None, "Summary JSON; the replies go beside it as .jsonl.")
_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Generation budget (our eval.max_new_tokens).")
_LIMIT = flags.DEFINE_integer("limit", 0, "First N problems only (0: all 164).")
_SKIP = flags.DEFINE_integer("skip", 0, "Leave out the first N problems (after --limit), to "
                             "finish a run in parts.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per generate call.")
_PREFILL = flags.DEFINE_bool("prefill", False, "HumanEval(prefill=...): task.reply_prefix of our run.")
# torch's OpenMP threads spin when another process holds the cores: several times slower.
_THREADS = flags.DEFINE_integer("threads", 0, "torch threads (0: torch's default).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "transformers' weights and compute (our run's config.model.dtype).")


def _ours(path: str) -> dict[str, dict]:
  rows = {}
  with open(path) as f:
    for line in f:
      r = json.loads(line)
      if "node_id" in r:  # node lines; problem lines carry no reply
        rows[str(r["problem_id"])] = r
  return rows


def main(argv):
  del argv
  import torch
  from transformers import AutoModelForCausalLM

  from morse_jax.llm import tokenizer as tokenizer_lib
  from morse_jax.tasks import humaneval

  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  folder = os.path.expanduser(_MODEL.value)
  # Our tokenizer and stop ids only: loading our weights too would hold a second copy (GBs).
  tok = tokenizer_lib.load_tokenizer(folder)
  model = types.SimpleNamespace(tokenizer=tok, stop_ids=tokenizer_lib.stop_ids(folder, tok))
  hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, _DTYPE.value)).eval()
  family = humaneval.HumanEval(prefill=_PREFILL.value)
  problems = humaneval.load()
  problems = problems[:_LIMIT.value] if _LIMIT.value else problems
  problems = problems[_SKIP.value:]
  token_prompts = single_agent_prompts(model, family, problems)
  pad = model.tokenizer.pad_id
  replies, start = [], time.perf_counter()
  for i in range(0, len(problems), _BATCH.value):
    chunk = token_prompts[i:i + _BATCH.value]
    width = max(len(p) for p in chunk)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
    with torch.no_grad():
      out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                        max_new_tokens=_NEW.value, eos_token_id=list(model.stop_ids),
                        pad_token_id=pad)
    for row in out[:, width:].tolist():
      end = next((j + 1 for j, t in enumerate(row) if t in model.stop_ids), len(row))
      replies.append(model.tokenizer.decode(row[:end], skip_special_tokens=True))
    print(f"{len(replies)}/{len(problems)} generated, {time.perf_counter() - start:.0f} s",
          flush=True)
  seconds = time.perf_counter() - start
  ours = _ours(_OURS.value) if _OURS.value else {}
  records, passed, ours_passed, equal = [], 0, 0, 0
  for p, reply in zip(problems, replies):
    node = dict(p.gold_graph[0])
    reply = family.reply_prefix(p, node) + reply  # as runner.run scores and records it
    score = family.score_node(p, node, reply, {})
    passed += score.passed
    rec = {"problem_id": p.id, "reply": reply, "passed": score.passed,
           "reason": score.details.get("reason", "")}
    if p.id in ours:
      rec["ours_passed"] = bool(ours[p.id]["passed"])
      rec["same_reply"] = ours[p.id]["reply"] == reply
      ours_passed += rec["ours_passed"]
      equal += rec["same_reply"]
    records.append(rec)
  summary = {"problems": len(problems), "max_new_tokens": _NEW.value, "dtype": _DTYPE.value,
             "transformers_pass@1": passed / len(problems), "transformers_seconds": seconds}
  if ours:
    summary.update({"ours_pass@1": ours_passed / len(problems), "same_replies": equal,
                    "ours_file": _OURS.value})
  for k, v in summary.items():
    print(f"{k:<24} {v}")
  if _OUT.value:
    with open(os.path.splitext(_OUT.value)[0] + ".jsonl", "w") as f:
      for rec in records:
        f.write(json.dumps(rec) + "\n")
  write_report("humaneval_transformers", _OUT.value, **summary)


if __name__ == "__main__":
  app.run(main)
