"""The committed APEx toy (assets/toy_apex): runs 1-5, 7, 8 and 12 on this 2-core CPU, each
continuing from its parent (`PARENT`, else the run before; docs/RESULTS.md,
assets/toy_apex_pretrain.log):

  python -m launchers.pretrain_toy --config=configs/toy/apex.py:1    # -> /tmp/toy_apex_1
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:2    # ... 3, 4, 5 -> /tmp/toy_apex_5
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:6    # procedure worlds, from run 5
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:7    # both, longer, from run 5
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:8    # run 7 continued -> /tmp/toy_apex_8
  python -m launchers.pretrain_toy --config=configs/toy/apex.py:12   # run 8 continued -> assets/toy_apex

Runs 1-4 taught the formats on eight new worlds each; run 5 taught reading (drills, copies after
a space); run 6 (not committed) and run 7 continue run 5 on procedure worlds
(datasets.world_records); run 8 continues run 7 on 30 new ones. Run 9 (not committed) continues
run 8 on noisy memories and made the procedure demo worse (docs/RESULTS.md); runs 10 (first
listed record as the unguided guess) and 11 (plan prompts' record words drawn anew) continue run
8 too, not committed (RESULTS, "The procedure demo on three worlds"); run 12 (committed) continues
run 8 on plan prompts with two negative memories, wrong-record runs first.
"""

from configs.toy import common

# run -> (toy settings, corpus settings). Runs 2-4 continue from the one before: the model's
# shape (hidden, layers, vocabulary) comes from that folder, their toy shape fields are unused.
RUNS = {
    1: (dict(steps=450, lr=2e-3, warmup=20, buckets=(256, 384, 512, 640)), {}),
    2: (dict(steps=400, lr=1.5e-3, warmup=10, buckets=(256, 384, 512, 640), seed=1), {}),
    3: (dict(steps=280, lr=1e-3, warmup=10, buckets=(384, 640, 1024, 1536), seed=2),
        dict(judge_share=0.2, align_share=0.15, distill_batches=3)),
    4: (dict(steps=140, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=3),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8)),
    # reading: drills of 3 hops and the copies after a space (apex_jax.toy.reading), on 30 new
    # worlds, three quarters of the planner / distiller / judge conversations left out
    5: (dict(steps=300, lr=1e-3, warmup=10, buckets=(384, 640, 1024, 1536), seed=5),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    # procedures: worlds whose career / property facts sit in records only experience names
    # (datasets.world_records), with the same reading drills and spaced copies
    6: (dict(steps=150, lr=7e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=6),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    # reading and procedures together, longer: from the committed run 5, on 30 procedure worlds
    7: (dict(steps=400, lr=7e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=7),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    # run 7 continued at a lower rate on 30 new procedure worlds: its loss was still falling
    8: (dict(steps=300, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=8),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    # run 8 continued on planner contexts as the demo's bank shows them: memories whose record
    # word the Distiller dropped or garbled, more plan prompts with memories, more summaries
    9: (dict(steps=300, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=9),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True, context_share=0.8, summary_share=0.5, memory_noise=0.3)),
    # run 8 continued where a run without the record word in its plan reads the first listed
    # record (corpus.record_guess): the toy's greedy guess had settled on one word per world,
    # so memory building never tried the others (RESULTS, "The procedure demo on three worlds")
    10: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=10),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, record_guess="first")),
    # run 8 continued where most plan prompts with memories show record words drawn anew
    # (corpus.fresh_record_words): the run-8 planner garbled the word a memory showed on
    # world 779 (12 of 15 plans)
    11: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=11),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, fresh_record_words=0.75)),
    # run 8 continued where plan prompts show two negative memories, wrong-record runs first
    # (corpus.context_negatives / decoy_negatives): the run-8 planner copied the decoy words of
    # the demo's negative memories (RESULTS, "Exploring in memory building")
    12: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=12),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, context_share=0.7, context_negatives=2, decoy_negatives=True)),
}
COMMITTED = 12  # the run whose model is assets/toy_apex
DATA = {5: dict(worlds=30, apex_other_share=0.25),
        6: dict(worlds=20, apex_other_share=0.5, world_procedures=True),
        7: dict(worlds=30, apex_other_share=0.4, world_procedures=True),
        8: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        9: dict(worlds=30, apex_other_share=0.5, world_procedures=True),
        10: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        11: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        12: dict(worlds=30, apex_other_share=0.3, world_procedures=True)}
PARENT = {6: 5, 7: 5, 10: 8, 11: 8, 12: 8}  # the run a run continues, where it is not the one before


def out_dir(run: int) -> str:
  return "assets/toy_apex" if run == COMMITTED else f"/tmp/toy_apex_{run}"


def get_config(arg=None):
  run = int(arg or 1)
  if run not in RUNS:
    raise ValueError(f"configs/toy/apex.py: run {arg!r} is not one of {sorted(RUNS)}")
  toy_values, corpus_values = RUNS[run]
  c = common.base(out_dir(run), hidden=192, vocab_size=2048, batch=16, **toy_values)
  c.init = "" if run == 1 else out_dir(PARENT.get(run, run - 1))
  c.corpus.update(corpus_values)
  c.data.update(corpus="apex", worlds=8, apex_topk=2, replay=0.0)
  c.data.update(DATA.get(run, {}))
  c.eval_examples = 128 if run <= 2 else 256  # as the runs were made
  return c
