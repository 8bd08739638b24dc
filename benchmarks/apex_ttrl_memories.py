"""The memories TTRL added to an APEx demo run's bank, their judged outcome against the gold answer.

  python -m benchmarks.apex_ttrl_memories --workdir=<workdir> [--seeds=0,1,2] \
      [--first_world=777 --world_entities=120 --world_questions=320 --seed_worlds=True]

A TTRL memory is one of `<workdir>/seed_<s>/memory.db` not in `banks/before_ttrl.db` (by id);
its answer is the last `answer '...'` of its workflow, scored by EM against the world's gold
answers for its question. Why it exists: TTRL's outcomes come from judges without ground
truth, and the memories of held-out questions are what their evaluation retrieves first
(RESULTS, "The procedure demo on three worlds").
"""

from __future__ import annotations

import os
import re
import sqlite3

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "The demo run's workdir (holding seed_<s>/).",
                               required=True)
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "The run's seeds.")
# flag names unique among the modules a test process imports (absl flags are global)
_WORLD = flags.DEFINE_integer("first_world", 777, "data.world_seed of the run.")
_ENTITIES = flags.DEFINE_integer("world_entities", 120, "data.entities of the run.")
_QUESTIONS = flags.DEFINE_integer("world_questions", 320, "data.questions of the run.")
_SEED_WORLDS = flags.DEFINE_bool("seed_worlds", True, "Seed s read world first_world + s.")
_ANSWER = re.compile(r"answer '(.*?)'")


def _ids(path: str) -> set[int]:
  with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
    return {i for (i,) in conn.execute("SELECT id FROM memories")}


def ttrl_memories(run_dir: str, gold: dict) -> dict:
  """{added, judged_correct, right} for one seed's folder; gold: question -> answers."""
  from apex_jax.judges.rule import exact_match
  before_path, after_path = (os.path.join(run_dir, "banks", "before_ttrl.db"),
                             os.path.join(run_dir, "memory.db"))
  for path in (after_path, before_path):
    if not os.path.isfile(path):  # sqlite would only say "unable to open database file"
      raise FileNotFoundError(
          f"{path}: no such bank. A seed's folder holds memory.db after TTRL, and "
          f"banks/before_ttrl.db only when the run's eval.ablations include 'without_ttrl'")
  before = _ids(before_path)
  with sqlite3.connect(f"file:{after_path}?mode=ro", uri=True) as conn:
    rows = [r for r in conn.execute("SELECT id, outcome, question, workflow_summary FROM memories")
            if r[0] not in before]
  right = 0
  for _, _, question, workflow in rows:
    answers = _ANSWER.findall(workflow)
    right += bool(answers) and exact_match(answers[-1].strip(), gold[question]) == 1.0
  return dict(added=len(rows), judged_correct=sum(r[1] == "correct" for r in rows), right=right)


def main(argv):
  del argv
  from apex_jax.datasets.world import World
  for s in map(int, _SEEDS.value):
    world = World.generate(_WORLD.value + (s if _SEED_WORLDS.value else 0), _ENTITIES.value,
                           _QUESTIONS.value, procedures=True)
    gold = {e.question: e.answers for e in world.examples}
    print(f"seed {s}:", ttrl_memories(os.path.join(_WORKDIR.value, f"seed_{s}"), gold))


if __name__ == "__main__":
  app.run(main)
