"""Where one engine decode call's time goes on CPU, by kind of op, from XLA's own trace.

  python -m benchmarks.engine_step_cpu --model=smollm2 --cases=4x460,32x280 --out=FILE

For each case ROWSxCONTEXT: an engine of the chat server's shape (32 slots, rows of 1024
tokens, 8 tokens a decode call: `inprocess.build_engine`'s config) holds ROWS greedy requests
with random prompts of CONTEXT tokens, prefilled. `--calls` decode calls are timed (ms per
call: the best and the median), then two more run under `jax.profiler`, and each op of their
trace is classified by the optimised HLO that XLA dumped for the decode program: the attention
kernel (custom call `morse_paged_attention_*`), the weight products kernel (`morse_skinny_matmul*`;
the output head, whose output has the vocabulary's width, apart) and everything else XLA runs
(norms, RoPE, the KV writes, sampling, the loop). Per call, from the trace: ms in each kind and
its share (the trace's own overhead included, so the kinds sum to more than an untraced call).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time

from absl import app, flags

_CUSTOM_CALL = re.compile(r'^\s*%?([\w.\-]+) = (\S+) custom-call\(.*custom_call_target="([^"]+)"')


def op_kinds(hlo_text: str, vocab: int) -> dict[str, str]:
  """Custom-call op name -> "attention", "head" or "products", from optimised HLO text."""
  kinds = {}
  for line in hlo_text.splitlines():
    m = _CUSTOM_CALL.match(line)
    if not m:
      continue
    name, shape, target = m.groups()
    if target.startswith("morse_paged_attention"):
      kinds[name] = "attention"
    elif target.startswith("morse_skinny_matmul"):
      dims = re.findall(r"\d+", shape.split("{")[0])
      kinds[name] = "head" if dims and int(dims[-1]) == vocab else "products"
  return kinds


def trace_split(events: list[dict], kinds: dict[str, str], module: str) -> dict[str, float]:
  """Microseconds per kind ("other" for ops not in `kinds`) over a trace's ops of `module`."""
  out = collections.Counter()
  for name, dur in _ops(events, module):
    out[kinds.get(name, "other")] += dur
  return dict(out)


def largest_others(events: list[dict], kinds: dict[str, str], module: str, n: int = 5) -> dict:
  """The n kinds of op outside `kinds` (names less their numeric suffix: `wrapped_convert.7`
  counts as `wrapped_convert`) that took the most microseconds in all."""
  out = collections.Counter()
  for name, dur in _ops(events, module):
    if name not in kinds:
      out[re.sub(r"\.\d+$", "", name)] += dur
  return dict(out.most_common(n))


def _ops(events: list[dict], module: str):
  for e in events:
    args = e.get("args") or {}
    if e.get("ph") == "X" and args.get("hlo_module") == module and "hlo_op" in args:
      yield args["hlo_op"], e.get("dur", 0.0)


def _decode_hlo(dump: str) -> str:
  files = glob.glob(os.path.join(dump, "*jit_decode*after_optimizations.txt"))
  if not files:
    raise FileNotFoundError(f"no optimised HLO of jit_decode under {dump} (XLA_FLAGS must name "
                            "it with --xla_dump_to before jax starts)")
  return open(max(files, key=os.path.getmtime)).read()


def run_case(model, rows: int, context: int, calls: int, dump: str) -> dict:
  import jax
  import numpy as np

  from apex_jax.judges import InProcessChat
  from apex_jax.judges.inprocess import build_engine
  from morse_jax import llm
  from morse_jax.llm.engine import Engine, Request

  engine, route = build_engine(InProcessChat(model, max_context=1024), slots=32,
                               cache_tokens=1 << 16)
  rng = np.random.default_rng(0)
  vocab = model.config.vocab_size
  for _ in range(rows):
    # budgets to the rows' end: the first rows decode while the last are prefilled
    engine.submit(Request(rng.integers(100, vocab - 100, context).tolist(),
                          engine.config.max_len - context, llm.GREEDY, stop_ids=(), route=route))
  while engine.step() and (engine.waiting or any(r is not None and r.state != "decode"
                                                 for r in engine.slots)):
    pass  # every row prefilled before the timed calls
  timed, live_rows = [], []
  original = Engine._decode

  def decode(self, live):
    start = time.perf_counter()
    original(self, live)
    timed.append(time.perf_counter() - start)
    live_rows.append(len(live))

  Engine._decode = decode
  try:
    while len(timed) < calls + 1:  # the first call may compile its row count's program
      engine.step()
    ms = [t * 1e3 for t in timed[1:]]
    trace_dir = tempfile.mkdtemp(prefix="engine_step_trace_")
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    engine.step()
    engine.step()
    jax.profiler.stop_trace()
  finally:
    Engine._decode = original
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"),
                          recursive=True))[-1]
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  kinds = op_kinds(_decode_hlo(dump), vocab)
  split = trace_split(events, kinds, "jit_decode")
  total = sum(split.values())
  if min(live_rows) < rows:
    raise RuntimeError(f"only {min(live_rows)} of {rows} rows were live in a measured call: "
                       f"context {context} leaves too short a budget")
  return {"rows": rows, "context": context, "call_ms_best": min(ms),
          "call_ms_median": statistics.median(ms),
          "traced_ms_per_call": {k: v / 2e3 for k, v in sorted(split.items())},
          "share": {k: v / total for k, v in sorted(split.items())},
          "largest_other_ms_per_call": {k: v / 2e3 for k, v in
                                        largest_others(events, kinds, "jit_decode").items()}}


def main(_):
  from benchmarks.common import bench_model, write_report

  f = flags.FLAGS
  model = bench_model(f.model, f.dtype)
  cases = []
  for case in f.cases:
    rows, context = map(int, case.split("x"))
    out = run_case(model, rows, context, f.calls, DUMP)
    cases.append(out)
    parts = ", ".join(f"{k} {v:.0f} ms ({out['share'][k]:.0%})"
                      for k, v in out["traced_ms_per_call"].items())
    print(f"{rows} rows x {context}: {out['call_ms_best']:.0f} ms a call (median "
          f"{out['call_ms_median']:.0f}); traced: {parts}; largest others (ms): "
          f"{ {k: round(v) for k, v in out['largest_other_ms_per_call'].items()} }", flush=True)
  write_report("engine_step_cpu", f.out, model=f.model, dtype=f.dtype, cases=cases)


if __name__ == "__main__":
  # XLA reads its flags once, when the backend starts: jax is not imported before this.
  DUMP = tempfile.mkdtemp(prefix="engine_step_hlo_")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text").strip()
  flags.DEFINE_string("model", "smollm2", "smollm2, tiny, a preset's name or a model folder.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights and cache.")
  flags.DEFINE_list("cases", ["4x460", "32x280"], "ROWSxCONTEXT: live rows, prompt tokens.")
  flags.DEFINE_integer("calls", 10, "Timed decode calls a case (8 tokens a row each).")
  flags.DEFINE_string("out", None, "Write the report as JSON to this file.")
  app.run(main)
