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
  with pytest.raises(CorruptCheckpointError, match="/3: metadata format"):
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
