"""What a checkpoint step holds beside its arrays: a JSON payload (APEx: the run's history and
counts) and optionally a snapshot of a store (APEx: the memory bank), so a killed run restarts
where its newest good step left off.

`steps.Checkpoints` writes a step's arrays (experts, optimiser state, rng, step) under
`<dir>/<step>`. Beside it, `<dir>/sidecar/<step>.json` holds what is not an array: the payload,
the store's counts, and the name and sha256 of `<dir>/sidecar/<step>.db`, the store as it stood
after that step (`Snapshotable.snapshot`, written atomically). The JSON carries the sha256 of its
own payload. Order of a save: bank file, JSON (both atomic, under the step's save lock once the
step is known to be new, so a step on disk keeps its own), then the orbax step (its atomic
commit): a crash leaves at most sidecar files of a step that does not exist, which are never
read and are pruned at the next save.

`restore_newest` is Checkpoints' fallback restore with the sidecar checked too: the newest step
whose arrays, JSON and bank file all check out; a damaged one is passed over with a warning and
moved aside with its sidecar files (`Checkpoints._set_aside`), so its number can be saved again;
another run's checkpoint is an error, as in Checkpoints. A step of the format this version
writes (`Checkpoints.is_current_format`) without its sidecar JSON is damaged; only older steps
may lack one where the caller allows it (`sidecar_required=False`: written before sidecars).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Protocol

from morse_jax import atomic
from morse_jax.checkpoint.steps import Checkpoints, CorruptCheckpointError

# The format string files of this kind have always carried (kept so existing runs resume).
_FORMAT = "apex_jax.training.resume/1"


class Snapshotable(Protocol):
  """A store saved beside each step (APEx's `MemoryBank`)."""

  def snapshot(self, path: str) -> str:
    """Writes a consistent copy to `path` atomically; returns its sha256."""

  def restore_snapshot(self, path: str, sha256: str) -> None:
    """Replaces the store's contents with the copy at `path`, checked against `sha256`."""

  def counters_state(self) -> dict:
    """In-memory counts that belong with the snapshot (JSON-able)."""

  def load_counters_state(self, state: dict) -> None:
    ...


def _digest(payload: Any) -> str:
  text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=True)
  return hashlib.sha256(text.encode()).hexdigest()


def steps_on_disk(directory: str) -> list[int]:
  """The committed orbax steps (integer-named folders; temporaries carry a suffix)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory)
                if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


class Sidecar:
  """The non-array part of each checkpoint step; see the module docstring."""

  def __init__(self, directory: str):
    self.checkpoints = os.path.abspath(directory)
    self.directory = os.path.join(self.checkpoints, "sidecar")

  def _json(self, step: int) -> str:
    return os.path.join(self.directory, f"{step}.json")

  def files(self, step: int) -> list[str]:
    """The sidecar files of `step` (those a save writes; some may be absent)."""
    return [self._json(step), os.path.join(self.directory, f"{step}.db")]

  def write(self, step: int, payload: dict, bank: Snapshotable | None = None) -> None:
    """Writes step's payload (and the bank's snapshot and counts, when given)."""
    os.makedirs(self.directory, exist_ok=True)
    payload = dict(payload)
    if bank is not None:
      name = f"{step}.db"
      sha = bank.snapshot(os.path.join(self.directory, name))
      payload["bank"] = {"file": name, "sha256": sha, "counts": bank.counters_state()}
    body = {"format": _FORMAT, "step": step, "payload": payload, "sha256": _digest(payload)}
    atomic.write_text(self._json(step), json.dumps(body, sort_keys=True), ".sidecar.")

  def read(self, step: int, *, required: bool = True) -> dict | None:
    """Step's payload, checked (its sha256, the bank file's); CorruptCheckpointError when it
    is damaged, or missing and `required` (else None)."""
    path = self._json(step)
    if not os.path.exists(path):
      if required:
        raise CorruptCheckpointError(f"checkpoint step {step} of {self.checkpoints}: {path} "
                                     f"is missing")
      return None
    try:
      with open(path, encoding="utf-8") as f:
        body = json.load(f)
      assert isinstance(body, dict) and body.get("format") == _FORMAT
      payload = body["payload"]
    except (OSError, ValueError, AssertionError, KeyError) as e:
      raise CorruptCheckpointError(f"{path} is unreadable or not a {_FORMAT} file "
                                   f"({type(e).__name__}: {e})") from None
    if body.get("step") != step or body.get("sha256") != _digest(payload):
      raise CorruptCheckpointError(f"{path} does not match its sha256 (or names another "
                                   f"step): the file is damaged")
    bank = payload.get("bank")
    if bank is not None:
      db = os.path.join(self.directory, bank["file"])
      if not os.path.isfile(db) or atomic.file_sha256(db) != bank["sha256"]:
        raise CorruptCheckpointError(f"checkpoint step {step}: memory bank snapshot {db} is "
                                     f"missing or does not match its sha256")
    return payload

  def restore_bank(self, payload: dict, bank: Snapshotable) -> None:
    """Puts the snapshot a payload names back into `bank` (its file and its counts)."""
    info = payload["bank"]
    try:
      bank.restore_snapshot(os.path.join(self.directory, info["file"]), info["sha256"])
    except Exception as e:  # the store's own error types: this step cannot be restored
      raise CorruptCheckpointError(str(e)) from e
    bank.load_counters_state(info.get("counts", {}))

  def prune(self) -> None:
    """Removes sidecar files of steps no longer (or never) committed."""
    if not os.path.isdir(self.directory):
      return
    keep = {str(s) for s in steps_on_disk(self.checkpoints)}
    for name in os.listdir(self.directory):
      stem = name.split(".")[0]
      if stem.isdigit() and stem not in keep and name.endswith((".json", ".db")):
        try:
          os.remove(os.path.join(self.directory, name))
        except FileNotFoundError:
          pass


def save(ckpt: Checkpoints, sidecar: Sidecar, state, payload: dict,
         bank: Snapshotable | None = None, *, force: bool = False) -> bool:
  """Saves a step due by `ckpt.every` (or forced): the sidecar first, then the arrays."""
  step = int(state.step)
  if not force and step % ckpt.every:
    return False
  saved = ckpt.maybe_save(state, force=True,
                          before_commit=lambda: sidecar.write(step, payload, bank))
  sidecar.prune()
  return saved


@dataclasses.dataclass
class RunCheckpoints:
  """`save` as `rl.loop.run_loop`'s saver: each due step's sidecar holds `payload()` (the
  history and counts as they stand after that step) and, with a bank, its snapshot."""
  ckpt: Checkpoints
  sidecar: Sidecar
  payload: Callable[[], dict]
  bank: Any = None

  def maybe_save(self, state, *, force: bool = False) -> bool:
    return save(self.ckpt, self.sidecar, state, self.payload(), self.bank, force=force)


def restore_newest(ckpt: Checkpoints, sidecar: Sidecar, template, *,
                   bank: Snapshotable | None = None,
                   sidecar_required: bool = True) -> tuple[Any, dict] | None:
  """(state, payload) of the newest step whose arrays and sidecar are sound, with the bank put
  back as it was at that step (when given and the step has a snapshot); None when there is no
  step. Damaged steps are passed over with a warning and moved aside with their sidecar files;
  when all are damaged, the newest one's error is raised. Another run's checkpoint
  (CheckpointError) is raised at once."""
  if not steps_on_disk(ckpt.directory):
    return None
  payloads = {}

  def check(step: int) -> None:
    # A step this version wrote always has its sidecar (`save` writes it first): one lost is
    # damage, even where steps written before sidecars existed are allowed without one.
    required = sidecar_required or ckpt.is_current_format(step)
    payload = payloads[step] = sidecar.read(step, required=required) or {}
    if bank is not None and payload.get("bank") is not None:
      sidecar.restore_bank(payload, bank)

  state = ckpt.restore(template, check=check, beside=sidecar.files)
  return state, payloads[int(state.step)]
