"""A one-off phase committed with its store's snapshot: resumed once, refused when damaged or
written under other settings."""

import json
import os

import pytest

from morse_jax import atomic
from morse_jax.checkpoint import CheckpointError, phase

FORMAT = "tests/phase/1"


class JsonStore:
  """A Snapshotable store: a dict saved as JSON, with one counter kept beside it."""

  def __init__(self):
    self.items, self.calls = {}, 0

  def snapshot(self, path):
    atomic.write_text(path, json.dumps(self.items, sort_keys=True))
    return atomic.file_sha256(path)

  def restore_snapshot(self, path, sha256):
    assert atomic.file_sha256(path) == sha256
    with open(path, encoding="utf-8") as f:
      self.items = json.load(f)

  def counters_state(self):
    return {"calls": self.calls}

  def load_counters_state(self, state):
    self.calls = state["calls"]


def _commit(directory, store, identity=None):
  phase.commit(directory, "build", format_=FORMAT, identity=identity or {"n": 2}, store=store,
               result={"built": len(store.items)})


def test_a_committed_phase_puts_its_snapshot_back(tmp_path):
  where = str(tmp_path)
  assert phase.resume(where, "build", format_=FORMAT, identity={"n": 2},
                      store=JsonStore()) is None
  store = JsonStore()
  store.items, store.calls = {"a": 1, "b": 2}, 7
  _commit(where, store)
  assert sorted(os.listdir(where)) == ["build.db", "build.json"]
  later = JsonStore()
  later.items = {"changed": 0}  # what a later phase wrote
  assert phase.resume(where, "build", format_=FORMAT, identity={"n": 2},
                      store=later) == {"built": 2}
  assert later.items == {"a": 1, "b": 2} and later.calls == 7


def test_other_settings_are_refused_unless_asked_to_continue(tmp_path, capsys):
  where = str(tmp_path)
  store = JsonStore()
  store.items = {"a": 1}
  _commit(where, store, identity={"n": 2, "seed": 0})
  with pytest.raises(CheckpointError, match=r"build.json was written by a run with other "
                                             r"settings \(config seed differ\)"):
    phase.resume(where, "build", format_=FORMAT, identity={"n": 2, "seed": 1}, store=JsonStore())
  again = JsonStore()
  assert phase.resume(where, "build", format_=FORMAT, identity={"n": 2, "seed": 1}, store=again,
                      continue_other_run=True) == {"built": 1}
  assert again.items == {"a": 1} and "continuing that run's build" in capsys.readouterr().out
  with pytest.raises(CheckpointError, match="config format differ"):
    phase.resume(where, "build", format_="tests/phase/2", identity={"n": 2, "seed": 0},
                 store=JsonStore(), continue_other_run=True)


@pytest.mark.parametrize("damage", ["flip", "remove"])
def test_a_damaged_snapshot_is_an_error_not_a_rebuild(tmp_path, damage):
  where = str(tmp_path)
  store = JsonStore()
  store.items = {"a": 1}
  _commit(where, store)
  db = tmp_path / "build.db"
  if damage == "flip":
    db.write_text(db.read_text().replace("1", "2"))
  else:
    db.unlink()
  with pytest.raises(CheckpointError, match="build.db: the snapshot after build is missing or "
                                            "does not match its sha256"):
    phase.resume(where, "build", format_=FORMAT, identity={"n": 2}, store=JsonStore())
