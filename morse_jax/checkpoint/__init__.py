"""Checkpoints and resuming for both systems, in one place.

`steps`: a training state's orbax steps (checksums, a fallback past damaged steps, which move to
`damaged/`, unique temporaries, run ownership; format `morse_jax.rl.state/2`). `sidecar`: what a
step holds beside its arrays (a checked JSON payload and a store's snapshot; APEx's history and
memory bank) and the newest-sound-step restore over both. `phase`: a one-off phase committed
once with its store's snapshot (APEx's memory building). A training run's life over them (its
identity, open, restore, metrics, saves, close) is `morse_jax.rl.run`'s: MoRSE's pipeline over
`steps`, APEx's stages and TTRL over `sidecar` too; `rl.trainer.fit` uses `steps`; APEx's memory
build `phase`. Atomic writes and file hashes are `morse_jax.atomic`'s.
"""

from morse_jax.checkpoint.steps import (CheckpointError, Checkpoints, CorruptCheckpointError,
                                        array_checksums, as_json, files_fingerprint,
                                        fingerprint)
from morse_jax.checkpoint.sidecar import RunCheckpoints, Sidecar, Snapshotable, restore_newest
from morse_jax.checkpoint import phase

__all__ = ["CheckpointError", "Checkpoints", "CorruptCheckpointError", "RunCheckpoints",
           "Sidecar", "Snapshotable", "array_checksums", "as_json", "files_fingerprint",
           "fingerprint", "phase", "restore_newest"]
