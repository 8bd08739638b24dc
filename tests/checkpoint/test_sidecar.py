"""Sidecars of checkpoint steps (APEx's resume): damaged steps are passed over, whichever part is
damaged."""

from __future__ import annotations

import os
import shutil

import pytest

from morse_jax.checkpoint import sidecar as resume
from morse_jax.checkpoint.steps import Checkpoints, CorruptCheckpointError
from tests.checkpoint.test_steps import META, _set_format, assert_same, make_state


def _save(directory: str, steps) -> None:
  with Checkpoints(directory, every=1, keep=5, metadata=META) as ckpt:
    for s in steps:
      resume.save(ckpt, resume.Sidecar(directory), make_state(s, step=s, cursor=s),
                  {"history": [s]})


def _restore(directory: str, **kwargs):
  with Checkpoints(directory, every=1, keep=5, metadata=META) as ckpt:
    return resume.restore_newest(ckpt, resume.Sidecar(directory), make_state(0), **kwargs)


def test_damaged_format_and_lost_checksums_fall_back_to_the_newest_good_step(tmp_path):
  _save(str(tmp_path), (1, 2, 3))
  _set_format(tmp_path / "3", "morse_jax.rl.stbte/2")
  shutil.rmtree(tmp_path / "2" / "checksums")
  state, payload = _restore(str(tmp_path))
  assert_same(state, make_state(1, step=1, cursor=1))
  assert payload == {"history": [1]}
  shutil.rmtree(tmp_path / "1" / "checksums")
  with pytest.raises(CorruptCheckpointError, match="/1 .*checksums are missing"):
    _restore(str(tmp_path))


def test_a_step_of_this_format_without_its_sidecar_is_damaged(tmp_path):
  """Even where steps from before sidecars may lack one (run_stages), this version's may not:
  it would resume with an empty history."""
  _save(str(tmp_path), (1, 2))
  os.remove(tmp_path / "sidecar" / "2.json")
  state, payload = _restore(str(tmp_path), sidecar_required=False)
  assert int(state.step) == 1 and payload == {"history": [1]}


def test_an_older_step_without_a_sidecar_restores_with_an_empty_payload(tmp_path):
  _save(str(tmp_path), (1,))
  os.remove(tmp_path / "sidecar" / "1.json")
  _set_format(tmp_path / "1", "morse_jax.rl.state/1")
  state, payload = _restore(str(tmp_path), sidecar_required=False)
  assert_same(state, make_state(1, step=1, cursor=1))
  assert payload == {}
  with pytest.raises(CorruptCheckpointError, match="1.json is missing"):
    _restore(str(tmp_path))


def test_a_damaged_step_moves_aside_with_its_sidecar_and_is_saved_again(tmp_path):
  """Resuming past a damaged step 3 then saving step 3 again wrote nothing (it was on disk);
  its sidecar moves aside with it, and the new step 3 restores with its own payload."""
  _save(str(tmp_path), (1, 2, 3))
  shutil.rmtree(tmp_path / "3" / "checksums")
  state, payload = _restore(str(tmp_path))
  assert int(state.step) == 2 and payload == {"history": [2]}
  (aside,) = os.scandir(tmp_path / "damaged")
  assert sorted(os.listdir(os.path.join(aside.path, "sidecar"))) == ["3.json"]
  assert not os.path.exists(tmp_path / "sidecar" / "3.json")
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert resume.save(ckpt, resume.Sidecar(str(tmp_path)), make_state(33, step=3, cursor=3),
                       {"history": [2, 33]})
  state, payload = _restore(str(tmp_path))
  assert_same(state, make_state(33, step=3, cursor=3))
  assert payload == {"history": [2, 33]}


def test_a_step_on_disk_keeps_its_sidecar(tmp_path):
  """A second save of a step on disk is skipped: it wrote its payload over the step's own
  first, pairing the first save's arrays with the second's history."""
  _save(str(tmp_path), (2,))
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert not resume.save(ckpt, resume.Sidecar(str(tmp_path)), make_state(9, step=2),
                           {"history": ["other"]})
  state, payload = _restore(str(tmp_path))
  assert_same(state, make_state(2, step=2, cursor=2))
  assert payload == {"history": [2]}
