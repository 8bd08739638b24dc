"""A seeded run gives the same numbers in another process, whatever its PYTHONHASHSEED and the
number of cores it may use (docs/RESULTS.md, "Reproducible runs"): each case runs in two
subprocesses, one on every core with one hash seed, one on a single core with another."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_collections
import pytest

from morse_jax import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUS = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 schedulable cores")


# One core, taken by the child itself before anything starts a thread (a preexec_fn would fork
# this process, whose JAX threads may hold locks): `python -c ONE_CORE -m module args` or
# `python -c ONE_CORE -c code args`.
ONE_CORE = """
import os, runpy, sys
os.sched_setaffinity(0, [int(os.environ["ONE_CORE"])])
flag, what, *rest = sys.argv[1:]
sys.argv = [what, *rest]
if flag == "-m":
  runpy.run_module(what, run_name="__main__", alter_sys=True)
else:
  exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
"""


def run(*argv: str, hash_seed: int, one_core: bool, timeout: int = 120) -> str:
  """`python argv` from the repository root (on one core: the first this process may use) ->
  its stdout; the environment's pool size and fake devices left out, so the child sizes its
  own."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC", "NPROC")}
  env.update(PYTHONHASHSEED=str(hash_seed), JAX_PLATFORMS="cpu", ONE_CORE=str(CPUS[0]))
  argv = ("-c", ONE_CORE, *argv) if one_core else argv
  done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def twice(*argv: str) -> tuple[str, str]:
  """Once on every core with hash seed 1, once on one core with hash seed 2."""
  return run(*argv, hash_seed=1, one_core=False), run(*argv, hash_seed=2, one_core=True)


SEARCH = """
import hashlib
from apex_jax import experiment
from apex_jax.tools.overlap import NgramSearch
from configs.apex import demo_procedures

c = demo_procedures.get_config()
c.data.world_seed = 779
train, test, passages = experiment.load_data(c)
search = NgramSearch(passages, topk=2)
for ex in train + test:
  print(hashlib.sha256(search.scores(ex.question).tobytes()).hexdigest()[:16])
"""


def test_ngram_scores_do_not_depend_on_the_hash_seed():
  """The trigram search summed a query's idfs in its term set's order, which the hash seed sets:
  world 779's questions scored in other last bits in every process."""
  first, second = twice("-c", SEARCH)
  assert len(first.split()) > 100 and first == second


def test_passages_with_the_same_idfs_tie_and_keep_corpus_order():
  """Summed in the query's order, a + b + c and c + b + a differ in the last bit: the later
  passage ranked first. Terms here come in text order, so that the old sum's order is fixed."""
  from apex_jax.tools.passages import Passage
  from apex_jax.tools.overlap import WordSearch

  class InTextOrder(WordSearch):
    terms = staticmethod(lambda text: text.split())

  # 7 passages; a, d once, b, e twice, c, f three times: passages 0 and 1 match the same idfs
  texts = ["a b c", "d e f", "b c", "c", "e f", "f", "z"]
  search = InTextOrder([Passage(str(i), t) for i, t in enumerate(texts)], topk=2)
  scores = search.scores("a b c f e d")
  assert scores[0] == scores[1] > scores[2]
  assert [p.id for p in search.search(["a b c f e d"])[0]] == ["0", "1"]


GRADIENT = """
import hashlib, sys
import ml_collections
from morse_jax import runtime

runtime.use_cpu_threads(ml_collections.ConfigDict({"cpu_threads": int(sys.argv[1])}))
import jax, jax.numpy as jnp, numpy as np

rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 1024, 192)), jnp.float32)
w = jnp.asarray(rng.standard_normal((192, 8)), jnp.float32)
# a LoRA factor's gradient: a contraction over batch x tokens, split over the intra-op threads
grad = jax.jit(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()))(w, x)
print(runtime.cpu_threads(), hashlib.sha256(np.asarray(grad).tobytes()).hexdigest())
"""


@needs_two_cores
def test_cpu_threads_make_a_gradient_the_same_on_one_core_and_on_two():
  many, one = twice("-c", GRADIENT, "2")
  assert many == one and many.split()[0] == "2"


def test_cpu_threads_is_checked_and_left_alone_at_zero(monkeypatch):
  monkeypatch.delenv("PJRT_NPROC", raising=False)
  for bad in (-1, 1.5, True, "2"):
    with pytest.raises(ValueError, match=rf"config.cpu_threads must be an integer >= 0, got "
                                         rf"{bad!r}"):
      runtime.use_cpu_threads(ml_collections.ConfigDict({"cpu_threads": bad}))
  runtime.use_cpu_threads(ml_collections.ConfigDict({"cpu_threads": 0}))
  runtime.use_cpu_threads(ml_collections.ConfigDict({}))
  assert "PJRT_NPROC" not in os.environ


def test_cpu_threads_once_the_backend_runs_only_warn(monkeypatch, caplog):
  """In a process whose CPU backend already started (this one), the pool stays as it is and the
  environment is not changed for the processes it starts."""
  import jax

  jax.devices()
  monkeypatch.delenv("PJRT_NPROC", raising=False)
  runtime.use_cpu_threads(ml_collections.ConfigDict({"cpu_threads": 3}))
  assert "PJRT_NPROC" not in os.environ
  assert "config.cpu_threads=3 not applied" in caplog.text


def numbers(folder: str) -> dict:
  """Every number a run wrote under `folder`: its JSON and JSONL files (the folder's path and
  the clock's readings left out: seconds, time_*, *_per_s, timestamps), its memory banks' rows and its adapters' bytes (checkpoint
  arrays are not compared: OCDBT's files differ from save to save)."""
  import hashlib
  import sqlite3

  def timed(key):
    return key == "seconds" or key.startswith("time_") or key.endswith("_per_s") or \
        "timestamp" in key

  def clean(value):
    if isinstance(value, dict):
      return {k: clean(v) for k, v in value.items() if not timed(k)}
    if isinstance(value, list):
      return [clean(v) for v in value]
    return value.replace(folder, "<run>") if isinstance(value, str) else value

  out = {}
  for where, _, files in os.walk(folder):
    for name in sorted(files):
      path = os.path.join(where, name)
      rel = os.path.relpath(path, folder)
      if name.endswith(".jsonl"):
        with open(path) as f:
          out[rel] = [clean(json.loads(line)) for line in f if line.strip()]
      elif name.endswith(".json") or name == "_CHECKPOINT_METADATA":
        with open(path) as f:
          out[rel] = clean(json.load(f))
      elif name.endswith(".db"):
        with sqlite3.connect(path) as conn:
          out[rel] = list(conn.iterdump())
      elif name.endswith(".safetensors"):
        with open(path, "rb") as f:
          out[rel] = hashlib.sha256(f.read()).hexdigest()
  return out


def first_difference(a, b, where: str = "") -> str:
  """Where two trees of JSON values first differ, and how; "" when they are equal."""
  if isinstance(a, dict) and isinstance(b, dict):
    keys = list(dict.fromkeys([*a, *b]))
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    keys = range(len(a))
  else:
    return "" if a == b else f"{where}: {str(a)[:200]} != {str(b)[:200]}"
  for key in keys:
    if isinstance(a, dict) and (key not in a or key not in b):
      return f"{where}/{key}: only in one run"
    found = first_difference(a[key], b[key], f"{where}/{key}")
    if found:
      return found
  return ""


APEX = ["--config=configs/apex/demo_procedures.py", "--config.seeds=()",
        "--config.data.world_seed=779", "--config.memory_build.questions=2",
        "--config.memory_build.batch_size=2", "--config.stages.executor.steps=2",
        "--config.stages.executor.batch_size=2", "--config.stages.distiller.steps=0",
        "--config.stages.planner.steps=0", "--config.ttrl.steps=0", "--config.eval.questions=2",
        "--config.eval.batch_size=2", "--config.eval.ablations=('full',)",
        "--config.eval.untrained=False"]

MORSE = ["--config=configs/morse/demo_cpu.py", "--config.demo=False", "--config.train.steps=2",
         "--config.train.max_new_tokens=64", "--config.train.max_minutes=0.0"]


@pytest.mark.slow  # ~4 min a system: two short runs, the second reading the first's compiles
@needs_two_cores
@pytest.mark.parametrize("system", ["apex", "morse"])
def test_a_run_writes_the_same_numbers_in_another_process(system, tmp_path):
  """The demos' settings (config.cpu_threads 2), cut to two updates on few questions (APEx: of
  the executor, 2 x 4 episodes each): the second run has another hash seed, one core and the
  compile cache the first one filled. Without the pin the second update's loss, entropy and
  gradient norm and the trained adapter differ in their last bits (measured: RESULTS)."""
  args = {"apex": APEX, "morse": MORSE}[system]
  cache = f"--config.compilation_cache={tmp_path / 'xla'}"
  runs = []
  for seed, one_core in ((1, False), (2, True)):
    folder = str(tmp_path / f"run{seed}")
    run("-m", "launchers.train", *args, cache, f"--config.workdir={folder}", hash_seed=seed,
        one_core=one_core, timeout=900)
    runs.append(numbers(folder))
  assert len(runs[0]) >= 4 and not first_difference(*runs), first_difference(*runs)
