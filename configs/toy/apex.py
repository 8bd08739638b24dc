"""The APEx toy's pretraining runs (`assets/toy_apex` is run `COMMITTED`; `assets/toy_apex_mia`, run
`MIA_FORMS`, is that toy also taught the comparison systems' prompt forms, for their table):

  python -m launchers.pretrain_toy --config=configs/toy/apex.py:<run>

Each run continues `PARENT[run]` (else the run before; run 1 starts from scratch) and writes
`out_dir(run)`. What each run taught, which were kept and why: the table of runs in
docs/RESULTS.md, "Toy backbone"; every command and loss curve: assets/toy_apex_pretrain.log.
"""

from configs.toy import common

# run -> (toy settings, corpus settings); what each run adds and how it did: docs/RESULTS.md. A
# run that continues another takes the model's shape (hidden, layers, vocabulary) from its folder.
RUNS = {
    1: (dict(steps=450, lr=2e-3, warmup=20, buckets=(256, 384, 512, 640)), {}),
    2: (dict(steps=400, lr=1.5e-3, warmup=10, buckets=(256, 384, 512, 640), seed=1), {}),
    3: (dict(steps=280, lr=1e-3, warmup=10, buckets=(384, 640, 1024, 1536), seed=2),
        dict(judge_share=0.2, align_share=0.15, distill_batches=3)),
    4: (dict(steps=140, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=3),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8)),
    5: (dict(steps=300, lr=1e-3, warmup=10, buckets=(384, 640, 1024, 1536), seed=5),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    6: (dict(steps=150, lr=7e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=6),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    7: (dict(steps=400, lr=7e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=7),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    8: (dict(steps=300, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=8),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True)),
    9: (dict(steps=300, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=9),
        dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
             spaced_copies=True, context_share=0.8, summary_share=0.5, memory_noise=0.3)),
    10: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=10),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, record_guess="first")),
    11: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=11),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, fresh_record_words=0.75)),
    12: (dict(steps=240, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=12),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, context_share=0.7, context_negatives=2, decoy_negatives=True)),
    13: (dict(steps=160, lr=5e-4, warmup=5, buckets=(384, 640, 1024, 1536), seed=13),
         dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
              spaced_copies=True, context_share=0.7, context_negatives=2, decoy_negatives=True,
              mia_share=0.5)),
}
COMMITTED = 12  # the run whose model is assets/toy_apex
MIA_FORMS = 13  # run 12 also taught the comparison systems' prompt forms too: assets/toy_apex_mia
DATA = {5: dict(worlds=30, apex_other_share=0.25),
        6: dict(worlds=20, apex_other_share=0.5, world_procedures=True),
        7: dict(worlds=30, apex_other_share=0.4, world_procedures=True),
        8: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        9: dict(worlds=30, apex_other_share=0.5, world_procedures=True),
        10: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        11: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        12: dict(worlds=30, apex_other_share=0.3, world_procedures=True),
        13: dict(worlds=30, apex_other_share=0.3, world_procedures=True)}
PARENT = {6: 5, 7: 5, 10: 8, 11: 8, 12: 8, 13: 12}  # the run a run continues, where it is not the one before


def out_dir(run: int) -> str:
  if run == MIA_FORMS:
    return "assets/toy_apex_mia"
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
