"""The APEx CPU demo on a world where experience carries what the question does not: the career
and property facts sit in records (datasets.world_records), the right record's word is fixed per
category in this world and only a right episode's workflow shows it, so memories and skills built
from the pipeline's own episodes can tell the planner which record to search.

  python -m launchers.train --config=configs/apex/demo_procedures.py   # make demo-apex

Everything else is the demo's (configs/apex/demo_cpu.py); the questions are the two procedure
categories' only, so the held-out set measures the effect experience can have.
"""

from configs.apex import demo_cpu


def get_config(arg=None):
  c = demo_cpu.get_config(arg)
  c.workdir = "/tmp/apex_runs/demo_procedures"
  # 640 questions, ~142 of them career / property: ~107 train, 36 held out, the evaluation reads
  # 32 (in batches of 16): with 16 held out one question moved a world's F1 by 0.063 and no order
  # could reach significance (RESULTS, "Thirty-two held-out questions")
  c.data.update(procedures=True, categories=("career", "property"), questions=640)
  c.eval.questions = 32
  # the toy copies names greedily but garbles them sampled at 1: memories are built greedily
  c.memory_build.update(questions=24, temperature=0.0)
  # TTRL's queries are held-out questions, and each retrieves its own TTRL memory first; the
  # toy's arbiter called all 8 of world 778's "best" episodes correct, none was (RESULTS, "The
  # procedure demo on three worlds"): a memory is stored only for a group's majority answer
  c.ttrl.store = "majority"
  # the toy garbles the record word when it summarises a run as the Distiller (RESULTS,
  # "Rule-written workflow summaries"): the summaries are the runs' own searches, by rule
  c.agents.summaries = "rule"
  # the toy was taught skill replies to 4 memories (toy corpus distill_batch): shown the demo's
  # 8, its JSON degenerates (1 of 6 evolutions applied on the three worlds); shown 4, every bucket
  # with a correct memory gets its skill (3 of 6; RESULTS, "The Distiller's window")
  c.memory.bank.evolve_window = 4
  # 18 executor updates (the demo's 6 x 3): on worlds 777-779 full > untrained then holds on 3 of
  # 3 (pooled 8 / 1; at 6: 1 of 3), 18.5 min for three seeds, 15.0 at 6 (RESULTS, "Executor updates")
  c.stages.executor.steps = 18
  # the rows the demo's orders compare (full against without memories / skills, untrained);
  # --config.eval.ablations="()" gives every row, the module rows' TTRL reruns included
  c.eval.ablations = ("full", "without_memories", "without_skills", "without_memories_and_skills")
  c.seeds = (0, 1, 2)  # apex_jax.seeds: the whole chain per seed, the rows side by side
  # each seed its own world (777, 778, 779): memory building is greedy, so on one world every
  # seed would build the same memories and the seeds would not be independent draws of its effect
  c.seed_worlds = True
  c.seed_workers = 1  # one after the other, sharing the compilation cache (at once, 16.6 min became 28)
  # the agents on the generation engine: 14:47 against 16:22 for the three seeds alone on 2 cores,
  # each from an empty compile cache; seeds 0 and 2 print the same rows, seed 1's trained rows
  # part at a sampled near-tie (RESULTS, "make demo-apex on the engine"); 10:06 with the engine's
  # CPU attention kernel and its prefix cache (agents.engine_prefix_cache), the same table
  c.agents.engine = True
  return c
