"""A one-off phase of a run that must not be repeated on a restart because it wrote to a store
(APEx's memory building writes memories, win rates and skills to the bank).

`commit` snapshots the store to `<directory>/<name>.db` (`Snapshotable.snapshot`: atomic) and
then writes `<directory>/<name>.json` (atomic; written last, so it is the phase's commit): the
phase's result, the snapshot's sha256 and the store's counts, and the identity of the settings
the phase ran under with its fingerprint. `resume` of a committed phase puts the snapshot back
into the store and returns the result without running anything; None when nothing is committed.
A damaged snapshot is an error, not silently rebuilt; so is a commit of other settings, unless
`continue_other_run` (then it is used, with a note on stdout).
"""

from __future__ import annotations

import json
import os
from typing import Any

from morse_jax import atomic
from morse_jax.checkpoint.sidecar import Snapshotable
from morse_jax.checkpoint.steps import CheckpointError, fingerprint


def _paths(directory: str, name: str) -> tuple[str, str]:
  return os.path.join(directory, f"{name}.json"), os.path.join(directory, f"{name}.db")


def resume(directory: str, name: str, *, format_: str, identity: dict, store: Snapshotable,
           continue_other_run: bool = False, label: str = "") -> Any | None:
  """The committed result of phase `name` with its snapshot restored into `store`, or None."""
  marker, db = _paths(directory, name)
  if not os.path.exists(marker):
    return None
  with open(marker, encoding="utf-8") as f:
    saved = json.load(f)
  if saved.get("format") != format_ or saved.get("fingerprint") != fingerprint(identity):
    was = saved.get("identity") or {}
    differ = sorted(k for k in set(was) | set(identity) if was.get(k) != identity.get(k))
    text = (f"{marker} was written by a run with other settings (config "
            f"{', '.join(differ) or 'format'} differ)")
    if not continue_other_run or saved.get("format") != format_:
      raise CheckpointError(f"{text}: use another workdir, remove {directory} to start this "
                            f"one afresh, or continue that run's checkpoints with "
                            f"--config.train.continue_other_run=True")
    print(f"{label}{text}; continuing that run's {name} as asked (continue_other_run)",
          flush=True)
  if not os.path.isfile(db) or atomic.file_sha256(db) != saved["bank"]["sha256"]:
    raise CheckpointError(f"{db}: the snapshot after {name} is missing or does not match its "
                          f"sha256 (damaged); remove {directory} to start afresh")
  store.restore_snapshot(db, saved["bank"]["sha256"])
  store.load_counters_state(saved["bank"]["counts"])
  print(f"{label}{name}: resumed from {marker}", flush=True)
  return saved["stats"]


def commit(directory: str, name: str, *, format_: str, identity: dict, store: Snapshotable,
           result: Any) -> None:
  """Snapshots `store`, then writes the commit naming it and holding `result` (JSON-able)."""
  marker, db = _paths(directory, name)
  os.makedirs(directory, exist_ok=True)
  sha = store.snapshot(db)
  atomic.write_text(marker, json.dumps({
      "format": format_, "fingerprint": fingerprint(identity), "identity": identity,
      "stats": result, "bank": {"sha256": sha, "counts": store.counters_state()}},
      sort_keys=True))
