"""Orbax checkpoints of a training state (`rl.state.TrainState`): a stopped run resumes exactly.

Resuming exactly needs more than the weights: the optimiser moments, the PRNG key and the data
cursor too, or the resumed run samples different prompts and noise than an unbroken one would.
A state is any dataclass with the fields `step, experts, router, opt_states, rng, cursor` (`rng`
a typed key); restore returns the template's type. Every checkpoint also carries the run's
identity (model, LoRA, router and step configs) so that a checkpoint written for a different run
is refused with a readable message instead of being loaded into the wrong shapes, or silently
into the right shapes with the wrong meaning.

Trust:
- checksums: each step holds a `checksums` item (JSON: sha256, dtype and shape of every array's
  bytes, computed from the arrays being saved), written inside orbax's atomic commit. Restore
  recomputes them from the arrays read back and refuses a mismatch (CorruptCheckpointError naming
  the step and the array), so a flipped bit does not restore silently. Arrays not fully
  addressable from this process (multi-host sharding) are recorded without a hash and not
  checked. The metadata's format string says whether a step must have checksums: one of this
  format (`/2`) without them is damaged (its `checksums` folder was lost); only a step of the
  format before (`/1`, which may predate checksums) restores without them, with a warning.
- fallback: `restore()` of the latest step falls back to the newest step that restores cleanly
  when newer ones are corrupt (unreadable files or metadata, a format string this version does
  not know, an array that differs from its checksum, checksums missing), and logs which steps
  it skipped and why. Another run's step or a shape mismatch is never skipped over: that is an
  error, not damage.
- unique temporary names: orbax writes a step under `<step>.orbax-checkpoint-tmp` and deletes
  an existing directory of that name first, so two writers of one step destroyed each other's
  save; each save here gets its own temporary name (`...-tmp-<token>-<n>`, the token shared by
  all processes of a run). When another writer commits the step first, this save is dropped
  with a warning.
- ownership: with `identity`, the directory holds `run_identity.json` naming the run that owns
  it (its identity and a fingerprint of it). A run with another identity is refused with an
  error naming both, unless it asks to continue the other run (`continue_other_run=True`); the
  file then names the new identity and lists the one it continued.
- a step is its own: its state's `step` must be its directory's number (a directory renamed or
  copied from another step), its directory must not be a symbolic link (orbax never writes
  one; a link to another run's step would restore that run), and the run fingerprint its
  metadata records (since identities exist) must be the owner's, one the owner continued, or
  one the owner had before fields of its identity were retired. Otherwise it is damage.
- damaged steps are moved aside: once a fallback restore has found a good step, each newer step
  it skipped moves to `<dir>/damaged/<step>-<time>-<n>/` (with `reason.txt` and the files the
  caller keeps beside the step, e.g. its sidecar), which no step listing reads and `keep` never
  deletes: a person can inspect it, and the step number can be saved again. Only the first
  process moves, under the step's save lock, and only the directory it judged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import time
import uuid
from typing import Any, Callable, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp

from morse_jax import atomic

log = logging.getLogger(__name__)

T = TypeVar("T")  # the state dataclass
_TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX  # ".orbax-checkpoint-tmp"

# Steps of this format are always written with their checksums; one without them is damaged.
_FORMAT = "morse_jax.rl.state/2"
# Steps of the format before: checksums are checked where present, and where absent (written
# before checksums existed) the step restores unverified, with a warning.
_FORMAT_CHECKSUMS_OPTIONAL = "morse_jax.rl.state/1"
_FORMATS = (_FORMAT, _FORMAT_CHECKSUMS_OPTIONAL)
_ABSENT = "<absent>"


class CheckpointError(ValueError):
  """A checkpoint is missing, unreadable, corrupt or does not match this run."""


class CorruptCheckpointError(CheckpointError):
  """A step's files are damaged (unreadable, or an array differs from its checksum); an older
  step may still be good."""


IDENTITY_FILE = "run_identity.json"
_IDENTITY_FORMAT = "morse_jax.rl.state/run/1"
DAMAGED = "damaged"  # where damaged steps are moved (`Checkpoints._set_aside`)


def fingerprint(value: Any) -> str:
  """A short sha256 of a JSON-able value (keys sorted), e.g. of a run identity."""
  text = json.dumps(value, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


_WHOLE_FILE = 32 << 20  # files up to this size are hashed whole
_EDGE = 1 << 20  # of bigger ones, the first and last MiB (and the size)


def files_fingerprint(path: str) -> str:
  """A cheap fingerprint of the files under `path` (e.g. base model weights): each file's
  relative name and size, and the sha256 of its bytes when it is at most 32 MiB, else of its
  first and last MiB (hashing gigabytes of weights at every start would cost minutes; a
  fine-tuned copy of the same size whose edges match would pass). Modification times are left
  out, so a copy or a fresh clone keeps the fingerprint. '' for no path; 'missing:<path>' when
  nothing is there."""
  if not path:
    return ""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.exists(path):
    return f"missing:{path}"
  if os.path.isfile(path):
    files = [(os.path.basename(path), path)]
  else:
    files = sorted((os.path.relpath(os.path.join(root, name), path), os.path.join(root, name))
                   for root, _, names in os.walk(path) for name in names)
  rows = []
  for name, full in files:
    size = os.path.getsize(full)
    digest = hashlib.sha256()
    with open(full, "rb") as f:
      if size <= _WHOLE_FILE:
        digest.update(f.read())
      else:
        digest.update(f.read(_EDGE))
        f.seek(size - _EDGE)
        digest.update(f.read(_EDGE))
    rows.append([name, size, digest.hexdigest()])
  return fingerprint(rows)


def array_checksums(tree: Any) -> dict[str, dict]:
  """{leaf name: {"sha256", "dtype", "shape"}} of every array in `tree` (sha256 None for an
  array this process cannot read whole: multi-host sharding)."""
  out = {}
  for name, leaf in _flat(tree).items():
    entry = {"dtype": str(leaf.dtype), "shape": list(leaf.shape), "sha256": None}
    if getattr(leaf, "is_fully_addressable", True):
      data = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
      entry["sha256"] = hashlib.sha256(data.view(np.uint8).reshape(-1).data).hexdigest() \
          if data.size else hashlib.sha256(b"").hexdigest()
    out[name] = entry
  return out


def unique_temporary_path_class(token: str):
  """An orbax TemporaryPath whose names are unique per save: `<step>.orbax-checkpoint-tmp-
  <token>-<n>` (orbax's own is fixed per step and deleted when found, so concurrent writers of
  one step destroyed each other's files). Step listing ignores every name with the tmp suffix.
  Orbax's public `ocp.path.atomicity` and `CheckpointManagerOptions.temporary_path_class`
  (deprecated for `atomicity_options`, which cannot name a save's temporary: why pyproject pins
  orbax-checkpoint below 0.13)."""
  counter = itertools.count()

  class UniqueAtomicRenameTemporaryPath(ocp.path.atomicity.AtomicRenameTemporaryPath):

    @classmethod
    def from_final(cls, final_path, **options):
      # orbax's own from_final hands the same keywords to the constructor
      name = f"{final_path.name}{_TMP_SUFFIX}-{token}-{next(counter)}"
      return cls(final_path.parent / name, final_path, **options)

  return UniqueAtomicRenameTemporaryPath


def _stale(lock: str, max_age_s: float = 3600.0) -> bool:
  """Whether a step lock's writer is gone: on this host with its process not running, or the
  lock older than max_age_s (another host's writer cannot be asked)."""
  try:
    with open(lock) as f:
      owner = json.load(f)
    age = time.time() - os.path.getmtime(lock)
  except FileNotFoundError:
    return True
  except (OSError, ValueError):  # half-written by a writer that died between create and write
    try:
      return time.time() - os.path.getmtime(lock) > 60
    except FileNotFoundError:
      return True
  if age > max_age_s:
    return True
  if owner.get("host") == socket.gethostname():
    try:
      os.kill(int(owner.get("pid")), 0)
    except ProcessLookupError:
      return True
    except (PermissionError, TypeError, ValueError):
      return False
  return False


def _take_lock(path: str, token: str) -> bool:
  """Creates the lock file `path` (exclusive create); False when another live writer holds it.
  A lock whose writer is gone (same host, process not running) or that is older than an hour
  is taken over."""
  me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": token})
  for _ in range(2):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      if not _stale(path):
        return False
      log.warning("taking over stale checkpoint lock %s", path)
      _unlock(path)
      continue
    with os.fdopen(fd, "w") as f:
      f.write(me)
    return True
  return False


def _unlock(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _dir_id(path: str) -> tuple[int, int] | None:
  """(device, inode) of `path` itself (a link, not its target); None when nothing is there."""
  try:
    st = os.lstat(path)
  except FileNotFoundError:
    return None
  return st.st_dev, st.st_ino


def run_token() -> str:
  """A random token, the same on every process of a multi-host run."""
  token = uuid.uuid4().hex[:12]
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    raw = np.frombuffer(bytes.fromhex(token), np.uint8)
    token = bytes(np.asarray(multihost_utils.broadcast_one_to_all(raw))).hex()
  return token


_FIELDS = ("step", "experts", "router", "opt_states", "rng", "cursor")


def _saveable(state) -> dict[str, Any]:
  """Orbax cannot write typed keys, so the key travels as its uint32 data."""
  out = {name: getattr(state, name) for name in _FIELDS}
  out["rng"] = jax.random.key_data(state.rng)
  return out


def as_json(value: Any) -> Any:
  """What `value` reads back as after a JSON round trip (tuples -> lists, keys -> str): the one
  normalisation of a run's identity and metadata, as checkpoints store and compare them."""
  return json.loads(json.dumps(value))


def _first_difference(saved: Any, current: Any, path: str = "") -> tuple[str, Any, Any] | None:
  """(key path, saved value, current value) of the first difference, in the current order.
  A key only the saved side has is one this version no longer records (a retired field, such
  as the step config's remat before `train_step.EXECUTION_ONLY`): it is not a difference."""
  if isinstance(saved, dict) and isinstance(current, dict):
    for key in current:
      sub = f"{path}.{key}" if path else str(key)
      if key not in saved:
        return sub, saved.get(key, _ABSENT), current.get(key, _ABSENT)
      if (found := _first_difference(saved[key], current[key], sub)) is not None:
        return found
    return None
  if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
    for i, (s, c) in enumerate(zip(saved, current)):
      if (found := _first_difference(s, c, f"{path}[{i}]")) is not None:
        return found
    return None
  # True == 1 in Python, but a flag that became a count is a different run.
  if saved == current and isinstance(saved, bool) == isinstance(current, bool):
    return None
  return path or "metadata", saved, current


def _brief(error: Exception) -> str:
  """The first line of an orbax/tensorstore error; the full one stays on `__cause__`."""
  text = str(error).strip().splitlines()
  return (text[0] if text else type(error).__name__)[:300]


def _show(value: Any) -> str:
  return value if value is _ABSENT else json.dumps(value)


def _leaf_name(path: tuple[Any, ...]) -> str:
  """The dotted name orbax gives a leaf (e.g. `opt_states.0.0.mu.q.a`), used in errors."""
  return ".".join(ocp.tree.str_keypath(path))


def _flat(tree: Any, is_leaf=None) -> dict[str, Any]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {_leaf_name(path): leaf for path, leaf in leaves}


class Checkpoints:
  """Saves every `every` steps, keeps the newest `keep`, restores with checks.

  Each step is one orbax step directory holding `state` (the arrays) and `metadata` (JSON: the
  run identity given here plus the PRNG impl). Orbax writes a step under a temporary name
  (`<step>.orbax-checkpoint-tmp...`, `ocp.path.atomicity.AtomicRenameTemporaryPath`, the
  default for local paths) and renames it to
  `<step>` only once every item is written; step listing ignores the temporary names. Together
  with waiting for the save to finish, a crash at any point leaves either the complete new step
  or no new step, never a half-written latest one.
  """

  def __init__(self, directory: str, *, every: int, keep: int, metadata: dict,
               identity: dict | None = None, continue_other_run: bool = False):
    """`metadata`: what every step must match to be restored (shapes and meaning of the
    arrays). `identity`: the run that owns the directory (e.g. metadata plus seed, task, data
    and base-weight fingerprints); None leaves ownership unchecked (e.g. a reader)."""
    if every < 1 or keep < 1:
      raise ValueError(f"Checkpoints: every and keep must be >= 1, got {every}, {keep}")
    self.directory = os.path.abspath(directory)  # orbax requires absolute paths
    self.every = every
    self.keep = keep
    # Compared after the same JSON round trip the saved copy had; not JSON-able -> TypeError.
    self.metadata = as_json(metadata)
    self.identity = None if identity is None else as_json(identity)
    self.skipped: dict[int, str] = {}  # corrupt steps the last fallback restore passed over
    self._owner: dict | None = None  # this run's identity file as `_claim` left it
    self._token = run_token()
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True,
            temporary_path_class=unique_temporary_path_class(self._token)),
        item_handlers=self._handlers())
    if self.identity is not None:
      self._claim(continue_other_run)

  @staticmethod
  def _handlers() -> dict[str, ocp.CheckpointHandler]:
    # Named up front so a fresh manager can read item metadata (shapes) before any save.
    return {"state": ocp.StandardCheckpointHandler(), "metadata": ocp.JsonCheckpointHandler(),
            "checksums": ocp.JsonCheckpointHandler()}

  # ------------------------------------------------------------------------------ ownership

  def _claim(self, continue_other_run: bool) -> None:
    """Makes sure the directory belongs to this run (see the module docstring)."""
    path = os.path.join(self.directory, IDENTITY_FILE)
    mine = {"format": _IDENTITY_FORMAT, "fingerprint": fingerprint(self.identity),
            "identity": self.identity, "continued": []}
    owner = self._read_owner()
    if owner is not None and owner.get("fingerprint") == mine["fingerprint"]:
      self._owner = owner
      return
    self._owner = mine
    found = None if owner is None else _first_difference(owner.get("identity"), self.identity)
    if owner is not None:  # its steps record its fingerprints: they stay this folder's
      mine["earlier_fingerprints"] = owner.get("earlier_fingerprints", [])
    if owner is not None and found is None:  # only retired keys differ: the same run
      mine["continued"] = owner.get("continued", [])
      mine["earlier_fingerprints"] = [*mine["earlier_fingerprints"], owner.get("fingerprint")]
    elif owner is not None:
      where, was, now = found
      text = (f"{self.directory} belongs to run {owner.get('fingerprint')} and this is run "
              f"{mine['fingerprint']}: {where} is {_show(was)} there, {_show(now)} here")
      if not continue_other_run:
        raise CheckpointError(f"{text}. Use another workdir, or continue that run's "
                              f"checkpoints with --config.train.continue_other_run=True")
      log.warning("%s; continuing its checkpoints as asked (continue_other_run)", text)
      print(f"continuing run {owner.get('fingerprint')} as run {mine['fingerprint']} "
            f"({where}: {_show(was)} -> {_show(now)})")
      mine["continued"] = [*owner.get("continued", []), {k: owner.get(k) for k in
                                                         ("fingerprint", "identity")}]
    elif self._manager.all_steps():
      log.warning("%s holds checkpoints with no recorded run identity (written before "
                  "identities were); this run (%s) takes the directory over",
                  self.directory, mine["fingerprint"])
    if jax.process_index() == 0:
      atomic.write_text(path, json.dumps(mine, indent=1, sort_keys=True))

  def _read_owner(self) -> dict | None:
    """The directory's run identity file (None when there is none)."""
    path = os.path.join(self.directory, IDENTITY_FILE)
    if not os.path.exists(path):
      return None
    try:
      with open(path) as f:
        owner = json.load(f)
      assert isinstance(owner, dict) and owner.get("format") == _IDENTITY_FORMAT
    except (OSError, ValueError, AssertionError) as e:
      raise CheckpointError(f"{path}: run identity file is unreadable or not a "
                            f"{_IDENTITY_FORMAT} file ({type(e).__name__}: {e}); move it "
                            f"away to let this run own the directory") from None
    return owner

  def _owner_fingerprints(self) -> set[str] | None:
    """The run fingerprints this directory's steps may record: the owner's, those it had
    before fields were retired, and those of the runs it continued (None: no owner)."""
    owner = self._owner if self._owner is not None else self._read_owner()
    if owner is None:
      return None
    continued = [c.get("fingerprint") for c in owner.get("continued", []) if isinstance(c, dict)]
    return {owner.get("fingerprint"), *owner.get("earlier_fingerprints", []), *continued}

  def maybe_save(self, state, *, force: bool = False,
                 before_commit: Callable[[], None] | None = None) -> bool:
    """Saves when the step is a multiple of `every` (or `force`) and not saved yet.

    Blocks until the step is on disk (and older steps beyond `keep` are deleted). Returns
    whether it saved. `before_commit` (e.g. writing the step's sidecar) runs under the step's
    lock once the step is known to be new, before its arrays are written: a step already on
    disk keeps the files beside it.
    """
    step = int(state.step)
    if not force and step % self.every:
      return False
    # Orbax removes an existing `<step>` directory before writing it (Checkpointer.save always
    # passes force), so a step another writer committed since this manager last listed the
    # folder would be destroyed: the save holds a per-step lock file and lists the folder again
    # under it.
    lock = self._lock_step(step)
    if lock is None:
      return False
    try:
      return self._save_locked(state, step, before_commit)
    finally:
      if lock:
        _unlock(lock)

  def _lock_step(self, step: int) -> str | None:
    """Takes `<dir>/<step>.saving.lock` (`_take_lock`): its path ('' on processes other than
    the first, which do not lock), or None when another live writer holds it. Multi-host: the
    first process decides for all."""
    path = self._lock_path(step)
    got: str | None = ""
    if jax.process_index() == 0:
      got = path if _take_lock(path, self._token) else None
      if got is None:
        log.warning("checkpoint step %d of %s is being saved by another writer (%s); this "
                    "save is skipped", step, self.directory, path)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      ok = multihost_utils.broadcast_one_to_all(np.int32(got is not None))
      got = (got or "") if int(ok) else None
    return got

  def _lock_path(self, step: int) -> str:
    return os.path.join(self.directory, f"{step}.saving.lock")

  def _save_locked(self, state, step: int, before_commit) -> bool:
    self._manager.reload()  # another writer may have committed steps since
    if step in self._manager.all_steps():
      if step in self.skipped:  # skipped as damaged but not moved aside (see restore)
        log.warning("checkpoint step %d is on disk but corrupt (%s); it is kept, not "
                    "overwritten, and this save is skipped", step, self.skipped[step])
      else:
        log.warning("checkpoint step %d is already in %s; not saved again", step,
                    self.directory)
      return False
    if before_commit is not None:
      before_commit()
    metadata = {"format": _FORMAT, "rng_impl": str(jax.random.key_impl(state.rng)),
                "run": self.metadata}
    if self.identity is not None:
      metadata["identity"] = fingerprint(self.identity)
    arrays = _saveable(state)
    checksums = {"format": "sha256/1", "arrays": array_checksums(arrays)}
    try:
      # force=True: the decision is ours; orbax's own policy would also skip steps at or below
      # its latest, e.g. after resuming from an older step.
      saved = self._manager.save(step, force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(arrays), metadata=ocp.args.JsonSave(metadata),
          checksums=ocp.args.JsonSave(checksums)))
      # Returns once the temporary directory has been renamed to `<step>` (the commit) and the
      # steps beyond `keep` are gone; until then a crash leaves only the ignored temporary name.
      self._manager.wait_until_finished()
    except Exception as e:  # orbax / the filesystem: the rename onto a step another wrote
      self._manager.reload()
      self._remove_own_temporaries(step)
      if step in self._manager.all_steps():
        log.warning("checkpoint step %d in %s was written by another writer while this one "
                    "saved it; this save is dropped (%s)", step, self.directory, _brief(e))
        return False
      raise CheckpointError(f"saving checkpoint step {step} to {self.directory} failed: "
                            f"{_brief(e)}") from e
    return bool(saved)

  def _remove_own_temporaries(self, step: int) -> None:
    """This writer's temporary directories of `step` left by a failed save (others' are kept:
    they may still be writing)."""
    prefix = f"{step}{_TMP_SUFFIX}-{self._token}-"
    for name in os.listdir(self.directory):
      if name.startswith(prefix):
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

  def is_current_format(self, step: int) -> bool:
    """Whether the step's metadata names the format this version writes (False when it is
    older, unknown or unreadable): what a caller that keeps files beside the steps can use to
    tell a step that must have them from one written before they existed."""
    reader = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
        item_handlers=self._handlers())
    try:
      saved = reader.restore(step, args=ocp.args.Composite(
          metadata=ocp.args.JsonRestore()))["metadata"]
    except Exception:  # missing, garbage: damage that restore() reports
      return False
    finally:
      reader.close()
    return isinstance(saved, dict) and saved.get("format") == _FORMAT

  def latest_step(self) -> int | None:
    steps = self._manager.all_steps()
    return max(steps) if steps else None

  def restore(self, template: T, step: int | None = None, *, fallback: bool = True,
              check: Callable[[int], None] | None = None,
              beside: Callable[[int], list[str]] | None = None) -> T:
    """Restores `step` (the latest when None) shaped and placed like `template`.

    Raises CheckpointError when there is no such step, when it was written for another run
    (metadata differs), when an array's shape or dtype differs from the template, or when the
    step is damaged (CorruptCheckpointError: unreadable, an array that differs from its
    checksum, a state or run that is not the step's own; see the module docstring). `check`
    (step), called once a step's arrays restored, raises CorruptCheckpointError when what the
    caller keeps beside the step is damaged (a sidecar). With step None and `fallback`, a
    damaged latest step is passed over for the newest good one, with a warning naming what was
    skipped and why (also in `self.skipped`), and the skipped steps are moved aside with the
    files `beside(step)` names (`_set_aside`); only when every step is damaged is the newest
    one's error raised. A restore that raises changes nothing on disk.
    """
    # A separate read-only manager: it lists what is on disk now and cannot delete anything.
    reader = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
        item_handlers=self._handlers())
    try:
      steps = sorted(reader.all_steps())
      if step is None and not steps:
        raise CheckpointError(f"{self.directory}: no checkpoint to restore")
      if step is not None and step not in steps:
        raise CheckpointError(f"{self.directory}: no checkpoint at step {step} (have {steps})")
      candidates = [step] if step is not None else steps[::-1] if fallback else steps[-1:]
      found, out, seen = self._first_good(reader, candidates, template, check)
    finally:
      reader.close()
    if self.skipped:
      moved = [s for s in sorted(self.skipped)
               if self._set_aside(s, self.skipped[s], seen[s], beside)]
      self._manager.reload()
      text = (f"resuming from step {found} of {self.directory}: newer step(s) "
              f"{sorted(self.skipped)} are corrupt and were skipped" +
              (f"; {moved} moved to {os.path.join(self.directory, DAMAGED)}" if moved else ""))
      log.warning(text)
      print(text)
    return out

  def _first_good(self, reader: ocp.CheckpointManager, candidates: list[int], template: T,
                  check) -> tuple[int, T, dict[int, tuple[int, int] | None]]:
    """(step, state) of the first candidate that restores and passes `check`, and the
    directory id of every candidate tried (taken before it was read); the damaged ones passed
    over go to `self.skipped`. When no candidate is good, the first one's error is raised."""
    self.skipped, first_error, seen = {}, None, {}
    owners = self._owner_fingerprints()
    for s in candidates:
      seen[s] = _dir_id(os.path.join(self.directory, str(s)))
      try:
        out = self._restore_step(reader, s, template, owners)
        if check is not None:
          check(s)
      except CorruptCheckpointError as e:
        if len(candidates) == 1:
          raise
        first_error = first_error or e
        self.skipped[s] = str(e)
        log.warning("%s; trying the step before it", e)
        continue
      return s, out, seen
    raise first_error

  def _set_aside(self, step: int, reason: str, seen: tuple[int, int] | None,
                 beside: Callable[[int], list[str]] | None) -> bool:
    """Moves damaged `step` (and the files `beside` names) into a new folder under
    `<dir>/damaged/`, with `reason.txt`; whether it did. Only the first process moves, holding
    the step's save lock (no writer is saving the step meanwhile), and only when `<dir>/<step>`
    is still the directory (or link) that was judged (`seen`): another restorer may have moved
    it and a writer saved a new one since. A step it cannot move stays (and `maybe_save` of it
    is skipped)."""
    path = os.path.join(self.directory, str(step))
    if jax.process_index() != 0 or seen is None:
      return False
    lock = self._lock_path(step)
    if not _take_lock(lock, self._token):
      log.warning("damaged checkpoint step %d of %s is locked by another writer or restorer "
                  "(%s); left in place", step, self.directory, lock)
      return False
    target = os.path.join(self.directory, DAMAGED, f"{step}-{time.strftime('%Y%m%dT%H%M%S')}-"
                          f"{uuid.uuid4().hex[:8]}")
    try:
      if _dir_id(path) != seen:
        return False  # already moved by another restorer (a new step may stand there now)
      os.makedirs(target)
      atomic.write_text(os.path.join(target, "reason.txt"), reason + "\n")
      os.rename(path, os.path.join(target, str(step)))
      # Under the lock still: a writer of the step number writes its new sidecar under it.
      self._move_into(target, beside(step) if beside is not None else [])
    except OSError as e:
      log.warning("could not move damaged checkpoint step %d of %s aside (%s); left in place",
                  step, self.directory, e)
      shutil.rmtree(target, ignore_errors=True)  # holds no step: the rename failed
      return False
    finally:
      _unlock(lock)
    log.warning("moved damaged checkpoint step %d to %s: %s", step, target, reason)
    return True

  def _move_into(self, target: str, paths: list[str]) -> None:
    """Moves the files of `paths` that exist to the same place under `target` as under this
    directory; one that cannot move is left, with a warning (its step has moved)."""
    for name in paths:
      dest = os.path.join(target, os.path.relpath(name, self.directory))
      try:
        if os.path.lexists(name):
          os.makedirs(os.path.dirname(dest), exist_ok=True)
          os.rename(name, dest)
      except OSError as e:
        log.warning("could not move %s beside its damaged step to %s (%s)", name, target, e)

  def _restore_step(self, reader: ocp.CheckpointManager, step: int, template: T,
                    owners: set[str] | None) -> T:
    where = os.path.join(self.directory, str(step))
    if os.path.islink(where):
      raise CorruptCheckpointError(f"checkpoint {where} is a symbolic link (to "
                                   f"{os.readlink(where)}), and steps are only ever written as "
                                   f"directories: another run's step linked here?")
    rng_impl, format_ = self._check_metadata(reader, step, where, template, owners)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, _saveable(template))
    self._check_arrays(reader, step, where, target)
    try:
      out = reader.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
    except Exception as e:  # orbax/tensorstore raise many types for damaged files
      raise CorruptCheckpointError(f"checkpoint {where} is unreadable or corrupt: "
                                   f"{_brief(e)}") from e
    self._check_checksums(reader, step, where, out, required=format_ == _FORMAT)
    if int(out["step"]) != step:
      raise CorruptCheckpointError(f"checkpoint {where}: its state is step {int(out['step'])}, "
                                   f"not {step}: the directory was renamed or copied from "
                                   f"another step")
    return dataclasses.replace(template, **{**out, "rng": jax.random.wrap_key_data(
        out["rng"], impl=rng_impl)})

  def _check_metadata(self, reader: ocp.CheckpointManager, step: int, where: str,
                      template, owners: set[str] | None) -> tuple[str, str]:
    """Refuses another run's checkpoint before touching arrays; returns (the saved rng impl,
    the step's format). A format this version does not write or read is damage (a flipped
    bit in the string), as unreadable metadata is: the step is passed over on resume. So is a
    step that records a run fingerprint other than the `owners` of this directory: one step of
    another run among this run's, not a folder of another run."""
    try:
      saved = reader.restore(step, args=ocp.args.Composite(
          metadata=ocp.args.JsonRestore()))["metadata"]
    except Exception as e:  # missing file, garbage JSON
      raise CorruptCheckpointError(f"checkpoint {where}: metadata is unreadable or corrupt: "
                                   f"{_brief(e)}") from e
    format_ = saved.get("format") if isinstance(saved, dict) else None
    if format_ not in _FORMATS:
      raise CorruptCheckpointError(f"checkpoint {where}: metadata format {_show(format_)} is "
                                   f"none of {list(_FORMATS)}: damaged, or not a checkpoint "
                                   f"of this library (metadata {str(saved)[:200]})")
    recorded = saved.get("identity")
    if owners is not None and recorded is not None and recorded not in owners:
      raise CorruptCheckpointError(f"checkpoint {where} was written by run {recorded}, and "
                                   f"{self.directory} holds the steps of runs "
                                   f"{sorted(map(str, owners))}: another run's step copied here")
    found = _first_difference(saved.get("run"), self.metadata)
    if found is not None:
      path, was, now = found
      raise CheckpointError(f"checkpoint {where} was written for {path}={_show(was)}, "
                            f"this run has {_show(now)}")
    want = str(jax.random.key_impl(template.rng))
    if saved.get("rng_impl") != want:
      raise CheckpointError(f"checkpoint {where} was written for rng_impl="
                            f"{saved.get('rng_impl')!r}, this run has {want!r}")
    return want, format_

  @staticmethod
  def _check_arrays(reader: ocp.CheckpointManager, step: int, where: str, target: Any) -> None:
    """Names the leaf whose structure, shape or dtype differs (orbax would cast dtypes)."""
    try:
      saved = reader.item_metadata(step)["state"]
    except Exception as e:
      raise CorruptCheckpointError(f"checkpoint {where}: array metadata is unreadable or "
                                   f"corrupt: {_brief(e)}") from e
    if saved is None:
      raise CorruptCheckpointError(f"checkpoint {where}: array metadata is missing")
    is_array = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
    saved = _flat(getattr(saved, "tree", saved), is_leaf=is_array)
    wanted = _flat(target)
    for name in [*wanted, *(n for n in saved if n not in wanted)]:
      if name not in saved or name not in wanted:
        where_not = "the checkpoint" if name not in saved else "this run"
        raise CheckpointError(f"checkpoint {where}: leaf {name} is missing from {where_not}")
      have, want = saved[name], wanted[name]
      if tuple(have.shape) != tuple(want.shape) or have.dtype != want.dtype:
        raise CheckpointError(f"checkpoint {where}: leaf {name} is {have.dtype}"
                              f"{list(have.shape)}, this run has {want.dtype}{list(want.shape)}")

  @staticmethod
  def _check_checksums(reader: ocp.CheckpointManager, step: int, where: str, arrays, *,
                       required: bool) -> None:
    """Refuses arrays that differ from the sha256 recorded when the step was saved, and a step
    without checksums when its format always has them (`required`): its checksums folder was
    lost, so nothing vouches for its arrays."""
    if not os.path.isdir(os.path.join(where, "checksums")):
      if required:
        raise CorruptCheckpointError(f"checkpoint {where} (step {step}): its checksums are "
                                     f"missing, and every {_FORMAT} step is written with them: "
                                     f"the step is damaged")
      log.warning("checkpoint %s has no checksums (format %s, written before they existed): "
                  "its arrays are restored unverified", where, _FORMAT_CHECKSUMS_OPTIONAL)
      return
    try:
      saved = reader.restore(step, args=ocp.args.Composite(
          checksums=ocp.args.JsonRestore()))["checksums"]["arrays"]
      assert isinstance(saved, dict)
    except Exception as e:  # garbage JSON, wrong layout
      raise CorruptCheckpointError(f"checkpoint {where}: checksums are unreadable or corrupt: "
                                   f"{_brief(e)}") from e
    now = array_checksums(arrays)
    for name in [*now, *(n for n in saved if n not in now)]:
      if name not in saved or name not in now:
        raise CorruptCheckpointError(f"checkpoint {where}: array {name} has no checksum or no "
                                     f"data (checksums list {sorted(saved)[:8]}...)")
      want, got = saved[name], now[name]
      if want.get("sha256") is None or got["sha256"] is None:
        continue  # not addressable here when saved or now (multi-host)
      if want != got:
        raise CorruptCheckpointError(
            f"checkpoint {where} (step {step}): array {name} does not match its checksum (saved "
            f"{want.get('dtype')}{want.get('shape')} sha256 {str(want.get('sha256'))[:16]}, "
            f"read {got['dtype']}{got['shape']} sha256 {got['sha256'][:16]}): the files are "
            f"damaged")

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpoints:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
