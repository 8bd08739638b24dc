"""TrainState checkpoints: exact round trip, every/keep, run-identity checks, corrupt steps."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from morse_jax.checkpoint.steps import (IDENTITY_FILE, CheckpointError, Checkpoints,
                                        CorruptCheckpointError, files_fingerprint, fingerprint)
from morse_jax.rl.state import TrainState

META = {"model": {"hidden_size": 64, "family": "llama"}, "lora": {"rank": 2, "targets": ["q"]},
        "router": {"dim": 4}, "step": {"expert_lr": 8e-5}}
BIG = (64, 64)  # large enough that orbax stores its data outside the tree metadata


@functools.lru_cache(maxsize=None)  # states are immutable, so tests may share them
def make_state(seed: int, step: int = 0, cursor: int = 0, a_shape=(2, 3),
               dtype=jnp.float32) -> TrainState:
  """Distinct values everywhere, built in numpy: eager jnp ops would each compile (seconds)."""
  rng = np.random.default_rng(seed)
  # Random, so a BIG array does not compress away and gets its own data file.
  fill = lambda s: jnp.asarray((rng.standard_normal(s.shape) * 10).astype(s.dtype))
  experts = {"q": {"a": fill(jax.ShapeDtypeStruct(a_shape, dtype)),
                   "b": fill(jax.ShapeDtypeStruct((3, 2), dtype))}}
  router = {"w": fill(jax.ShapeDtypeStruct((4,), jnp.float32))}
  adamw = optax.adamw(1e-3)
  opt_states = (jax.tree.map(fill, jax.eval_shape(adamw.init, experts)),
                jax.tree.map(fill, jax.eval_shape(adamw.init, router)), None)
  return TrainState(step=jnp.asarray(step, jnp.int32), experts=experts, router=router,
                    opt_states=opt_states, cursor=jnp.asarray(cursor, jnp.int32),
                    rng=jax.random.wrap_key_data(np.array([7, seed], np.uint32)))


def files_under(path: str) -> dict[str, bytes]:
  out = {}
  for root, _, names in os.walk(path):
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return out


def step_dirs(path: str) -> list[int]:
  return sorted(int(name) for name in os.listdir(path) if name.isdigit())


def damaged(path) -> list:
  """The folders damaged steps were moved to, oldest name first."""
  folder = os.path.join(path, "damaged")
  return sorted(os.scandir(folder), key=lambda e: e.name) if os.path.isdir(folder) else []


def moved(files: dict[str, bytes], step: str, aside) -> dict[str, bytes]:
  """`files` (relative names) as they are once `step`'s directory has moved into `aside`."""
  return {(os.path.join("damaged", aside.name, name) if name.split(os.sep)[0] == step
           else name): data for name, data in files.items()}


def reason(aside) -> dict[str, bytes]:
  with open(os.path.join(aside.path, "reason.txt"), "rb") as f:
    return {os.path.join("damaged", aside.name, "reason.txt"): f.read()}


def assert_same(got: TrainState, want: TrainState):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jnp.issubdtype(y.dtype, jax.dtypes.prng_key):
      assert str(jax.random.key_impl(x)) == str(jax.random.key_impl(y))
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_bit_exact(tmp_path):
  want = make_state(3, step=5, cursor=40)
  with Checkpoints(str(tmp_path), every=10, keep=2, metadata=META) as ckpt:
    assert ckpt.maybe_save(want, force=True)
  with Checkpoints(str(tmp_path), every=10, keep=2, metadata=META) as ckpt:
    assert ckpt.latest_step() == 5
    got = ckpt.restore(make_state(0))
  assert_same(got, want)
  assert int(got.step) == 5 and int(got.cursor) == 40
  assert got.step.dtype == jnp.int32 and got.cursor.dtype == jnp.int32
  np.testing.assert_array_equal(jax.random.uniform(got.rng, (3,)),
                                jax.random.uniform(want.rng, (3,)))


def test_every_keep_and_latest(tmp_path):
  with Checkpoints(str(tmp_path), every=2, keep=2, metadata=META) as ckpt:
    saved = [ckpt.maybe_save(make_state(s, step=s, cursor=10 * s)) for s in range(1, 7)]
    assert saved == [False, True, False, True, False, True]
    assert not ckpt.maybe_save(make_state(6, step=6))  # already saved: not rewritten
    assert step_dirs(str(tmp_path)) == [4, 6] and ckpt.latest_step() == 6
    got = ckpt.restore(make_state(0))
    assert int(got.step) == 6 and int(got.cursor) == 60
    assert_same(ckpt.restore(make_state(0), step=4), make_state(4, step=4, cursor=40))


def test_metadata_mismatch_names_key_and_both_values(tmp_path):
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(1, step=2))
  before = files_under(str(tmp_path))
  other = {**META, "model": {**META["model"], "hidden_size": 32}}
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=other) as ckpt:
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path}/2 was written for "
                       "model.hidden_size=64, this run has 32"):
      ckpt.restore(make_state(0))
  extra = {**META, "lora": {**META["lora"], "dropout": 0.1}}
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=extra) as ckpt:
    with pytest.raises(CheckpointError, match="lora.dropout=<absent>, this run has 0.1"):
      ckpt.restore(make_state(0))
  assert files_under(str(tmp_path)) == before


@pytest.mark.parametrize("change, leaf", [
    ({"a_shape": (2, 4)}, r"leaf experts.q.a is float32\[2, 3\], this run has float32\[2, 4\]"),
    ({"dtype": jnp.bfloat16}, r"leaf experts.q.a is float32\[2, 3\], this run has bfloat16"),
])
def test_array_mismatch_names_the_leaf(tmp_path, change, leaf):
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
    with pytest.raises(CheckpointError, match=leaf):
      ckpt.restore(make_state(0, **change))
    no_router = TrainState(**{**vars(make_state(0)), "router": None})
    with pytest.raises(CheckpointError, match="leaf router.w is missing from this run"):
      ckpt.restore(no_router)


def _truncate_largest(step_dir):
  """Most likely the 64x64 array's data: the arrays' metadata stays readable."""
  sizes = {os.path.join(root, name): os.path.getsize(os.path.join(root, name))
           for root, _, names in os.walk(os.path.join(step_dir, "state")) for name in names}
  path = max(sizes, key=sizes.get)
  os.truncate(path, sizes[path] // 2)


def _truncate_state(step_dir):
  for root, _, names in os.walk(os.path.join(step_dir, "state")):
    for name in names:
      path = os.path.join(root, name)
      os.truncate(path, os.path.getsize(path) // 2)


def _delete_state(step_dir):
  for root, _, names in os.walk(os.path.join(step_dir, "state")):
    for name in names:
      os.remove(os.path.join(root, name))


def _garbage_metadata(step_dir):
  for root, _, names in os.walk(os.path.join(step_dir, "metadata")):
    for name in names:
      with open(os.path.join(root, name), "w") as f:
        f.write("{not json")


@pytest.mark.parametrize("corrupt",
                         [_truncate_largest, _truncate_state, _delete_state, _garbage_metadata])
def test_corrupt_newest_step_is_a_clear_error_and_older_survives(tmp_path, corrupt):
  with Checkpoints(str(tmp_path), every=2, keep=3, metadata=META) as ckpt:
    for s in (2, 4):
      assert ckpt.maybe_save(make_state(s, step=s, cursor=s, a_shape=BIG))
  corrupt(os.path.join(tmp_path, "4"))
  before = files_under(str(tmp_path))
  with Checkpoints(str(tmp_path), every=2, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {tmp_path}/4") as err:
      ckpt.restore(make_state(0, a_shape=BIG), fallback=False)
    assert err.value.__cause__ is not None or "missing" in str(err.value)
    assert files_under(str(tmp_path)) == before  # a failed restore changes nothing
    # Resuming (the latest step, fallback on) passes over the corrupt step 4, says so, and
    # moves it aside as it was.
    resumed = ckpt.restore(make_state(0, a_shape=BIG))
    assert_same(resumed, make_state(2, step=2, cursor=2, a_shape=BIG))
    assert list(ckpt.skipped) == [4] and f"{tmp_path}/4" in ckpt.skipped[4]
    (aside,) = damaged(tmp_path)
    assert step_dirs(str(tmp_path)) == [2] and aside.name.startswith("4-")
    assert files_under(str(tmp_path)) == {**moved(before, "4", aside), **reason(aside)}
    older = ckpt.restore(make_state(0, a_shape=BIG), step=2)
    assert_same(older, make_state(2, step=2, cursor=2, a_shape=BIG))
    # Training on from step 2: step 4 is saved again, then 6.
    assert ckpt.maybe_save(make_state(4, step=4, cursor=4, a_shape=BIG))
    assert ckpt.maybe_save(make_state(6, step=6, cursor=6, a_shape=BIG))
    assert step_dirs(str(tmp_path)) == [2, 4, 6]
    assert_same(ckpt.restore(make_state(0, a_shape=BIG), step=2), older)
    assert_same(ckpt.restore(make_state(0, a_shape=BIG), step=4),
                make_state(4, step=4, cursor=4, a_shape=BIG))
    assert_same(ckpt.restore(make_state(0, a_shape=BIG)),
                make_state(6, step=6, cursor=6, a_shape=BIG))


def test_half_written_step_is_not_a_checkpoint(tmp_path):
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(2, step=2))
  # What a crash during a save leaves behind: orbax's temporary name, never renamed.
  os.makedirs(os.path.join(tmp_path, "3.orbax-checkpoint-tmp-123", "state"))
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    assert ckpt.latest_step() == 2
    assert int(ckpt.restore(make_state(0)).step) == 2


def test_no_checkpoints(tmp_path):
  with Checkpoints(str(tmp_path / "none"), every=1, keep=1, metadata=META) as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(CheckpointError, match="no checkpoint to restore"):
      ckpt.restore(make_state(0))
    with pytest.raises(CheckpointError, match="no checkpoint at step 5"):
      ckpt.restore(make_state(0), step=5)


def test_restore_places_arrays_like_the_template(tmp_path, eight_devices):
  mesh = jax.sharding.Mesh(np.array(eight_devices), ("d",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  place = lambda state: TrainState(**{**vars(state), "experts": {"q": {
      "a": jax.device_put(state.experts["q"]["a"], sharded), "b": state.experts["q"]["b"]}}})
  want = place(make_state(5, step=3, a_shape=(8, 3)))
  with Checkpoints(str(tmp_path), every=1, keep=1, metadata=META) as ckpt:
    ckpt.maybe_save(want)
    got = ckpt.restore(place(make_state(0, a_shape=(8, 3))))
  assert got.experts["q"]["a"].sharding == sharded
  assert_same(got, want)


# ----------------------------------------------------------------- trust


def _flip_bit_in_array_data(step_dir, offset_fraction=0.5):
  """Flips one bit in the middle of the largest data file of the step's arrays."""
  sizes = {os.path.join(root, name): os.path.getsize(os.path.join(root, name))
           for root, _, names in os.walk(os.path.join(step_dir, "state")) for name in names}
  path = max(sizes, key=sizes.get)
  with open(path, "r+b") as f:
    f.seek(int(sizes[path] * offset_fraction))
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x10]))


def test_flipped_bit_is_refused_naming_step_and_array(tmp_path):
  with Checkpoints(str(tmp_path), every=2, keep=3, metadata=META) as ckpt:
    for s in (2, 4):
      ckpt.maybe_save(make_state(s, step=s, cursor=s, a_shape=BIG))
  assert os.path.isdir(tmp_path / "4" / "checksums")
  _flip_bit_in_array_data(os.path.join(tmp_path, "4"))
  with Checkpoints(str(tmp_path), every=2, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError,
                       match=r"/4 \(step 4\): array \S+ does not match its checksum"):
      ckpt.restore(make_state(0, a_shape=BIG), step=4)
    with pytest.raises(CorruptCheckpointError, match="step 4"):
      ckpt.restore(make_state(0, a_shape=BIG), fallback=False)


def test_resume_falls_back_to_newest_good_step_and_says_so(tmp_path, caplog, capsys):
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (1, 2, 3):
      ckpt.maybe_save(make_state(s, step=s, cursor=s, a_shape=BIG))
  _flip_bit_in_array_data(os.path.join(tmp_path, "3"))
  _truncate_state(os.path.join(tmp_path, "2"))
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    got = ckpt.restore(make_state(0, a_shape=BIG))
  assert_same(got, make_state(1, step=1, cursor=1, a_shape=BIG))
  assert sorted(ckpt.skipped) == [2, 3]
  assert "resuming from step 1" in capsys.readouterr().out
  assert any("newer step(s) [2, 3] are corrupt" in r.getMessage() for r in caplog.records)


def test_every_step_corrupt_raises_the_newest_error(tmp_path):
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (1, 2):
      ckpt.maybe_save(make_state(s, step=s, a_shape=BIG))
  for s in (1, 2):
    _truncate_state(os.path.join(tmp_path, str(s)))
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=f"{tmp_path}/2"):
      ckpt.restore(make_state(0, a_shape=BIG))


def test_another_runs_step_is_not_fallen_back_over(tmp_path):
  """A metadata mismatch is not damage: no fallback to an older step of the same folder."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
  other = {**META, "lora": {"rank": 4, "targets": ["q"]}}
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=other) as ckpt:
    with pytest.raises(CheckpointError, match="lora.rank=2, this run has 4") as err:
      ckpt.restore(make_state(0))
    assert not isinstance(err.value, CorruptCheckpointError)


def test_saves_use_unique_temporary_names(tmp_path):
  # Orbax's own temporary name for step 3 (what another writer may be writing right now): a
  # save of step 3 here must neither reuse nor delete it.
  theirs = tmp_path / "3.orbax-checkpoint-tmp"
  theirs.mkdir()
  (theirs / "in_progress").write_text("another writer's files")
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as a, \
       Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as b:
    assert a._token != b._token
    assert a.maybe_save(make_state(3, step=3))
  assert (theirs / "in_progress").read_text() == "another writer's files"
  assert step_dirs(str(tmp_path)) == [3]


def test_two_writers_of_one_step_do_not_collide(tmp_path, caplog):
  """Orbax deletes an existing step directory before writing it: a second writer whose listing
  is stale must not destroy the step the first committed, nor write while the first holds the
  step's lock."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as a, \
       Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as b:
    b._manager.all_steps()  # b lists the folder before a saves
    assert a.maybe_save(make_state(2, step=2))
    assert not b.maybe_save(make_state(7, step=2))
    assert any("already in" in r.getMessage() for r in caplog.records)
    # another live writer (this process) holds step 3's lock: b skips, a's lock stays
    lock = tmp_path / "3.saving.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    assert not b.maybe_save(make_state(7, step=3))
    assert lock.exists() and any("being saved by another writer" in r.getMessage()
                                 for r in caplog.records)
    # a lock left by a process that is gone is taken over
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 12345}))
    assert b.maybe_save(make_state(3, step=3)) and not lock.exists()
  assert step_dirs(str(tmp_path)) == [2, 3]
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert_same(ckpt.restore(make_state(0), step=2), make_state(2, step=2))


IDENTITY = {"trainer": META, "seed": 0, "task": {"family": "synthetic"}, "data": "d0",
            "base_weights": {"path": "/m", "files": "f0"}}


def test_run_directory_belongs_to_one_identity(tmp_path):
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=IDENTITY) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=IDENTITY) as ckpt:
    assert int(ckpt.restore(make_state(0)).step) == 1  # the same run resumes
  seed1 = {**IDENTITY, "seed": 1}
  with pytest.raises(CheckpointError) as err:
    Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=seed1)
  text = str(err.value)
  assert fingerprint(IDENTITY) in text and fingerprint(seed1) in text
  assert "seed is 0 there, 1 here" in text and "continue_other_run=True" in text
  for change in ({"data": "d1"}, {"base_weights": {"path": "/m", "files": "f1"}},
                 {"task": {"family": "humaneval"}}):
    with pytest.raises(CheckpointError, match="belongs to run"):
      Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity={**IDENTITY, **change})


def test_continue_other_run_on_request(tmp_path, capsys):
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=IDENTITY) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
  seed1 = {**IDENTITY, "seed": 1}
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=seed1,
                   continue_other_run=True) as ckpt:
    assert int(ckpt.restore(make_state(0)).step) == 1
    ckpt.maybe_save(make_state(2, step=2))
  assert "continuing run" in capsys.readouterr().out
  owner = json.loads((tmp_path / IDENTITY_FILE).read_text())
  assert owner["fingerprint"] == fingerprint(seed1)
  assert [c["fingerprint"] for c in owner["continued"]] == [fingerprint(IDENTITY)]
  # The folder now belongs to the continued run: the first identity is the other run now.
  with pytest.raises(CheckpointError, match="seed is 1 there, 0 here"):
    Checkpoints(str(tmp_path), every=1, keep=2, metadata=META, identity=IDENTITY)


def _set_format(step_dir, value: str):
  """Rewrites the `format` string in a step's metadata item (orbax's JSON file)."""
  path = os.path.join(step_dir, "metadata", "metadata")
  with open(path) as f:
    saved = json.load(f)
  assert saved["format"] == "morse_jax.rl.state/2"
  with open(path, "w") as f:
    json.dump({**saved, "format": value}, f)


def test_step_written_before_checksums_restores_with_a_warning(tmp_path, caplog):
  """A step of the format before (/1, which may predate checksums): restored unverified."""
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
  shutil.rmtree(tmp_path / "1" / "checksums")
  _set_format(tmp_path / "1", "morse_jax.rl.state/1")
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    assert_same(ckpt.restore(make_state(0)), make_state(1, step=1))
  assert any("has no checksums" in r.getMessage() for r in caplog.records)


def test_old_format_step_with_checksums_still_checks_them(tmp_path):
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    ckpt.maybe_save(make_state(1, step=1, a_shape=BIG))
  _set_format(tmp_path / "1", "morse_jax.rl.state/1")
  _flip_bit_in_array_data(os.path.join(tmp_path, "1"))
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match="does not match its checksum"):
      ckpt.restore(make_state(0, a_shape=BIG))


def test_step_of_this_format_without_checksums_is_refused(tmp_path, caplog):
  """Its checksums folder deleted, a flipped bit would restore unseen: the step is damaged, and
  resuming falls back to the newest good step; alone, it is a clear error."""
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    for s in (1, 2):
      ckpt.maybe_save(make_state(s, step=s, cursor=s, a_shape=BIG))
  shutil.rmtree(tmp_path / "2" / "checksums")
  _flip_bit_in_array_data(os.path.join(tmp_path, "2"))
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError,
                       match=r"/2 \(step 2\): its checksums are missing, and every "
                             r"morse_jax.rl.state/2 step is written with them"):
      ckpt.restore(make_state(0, a_shape=BIG), step=2)
    resumed = ckpt.restore(make_state(0, a_shape=BIG))
    assert_same(resumed, make_state(1, step=1, cursor=1, a_shape=BIG))
    assert list(ckpt.skipped) == [2] and "checksums are missing" in ckpt.skipped[2]
  assert not any("has no checksums" in r.getMessage() for r in caplog.records)
  assert step_dirs(str(tmp_path)) == [1] and len(damaged(tmp_path)) == 1
  shutil.rmtree(tmp_path / "1" / "checksums")
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=f"{tmp_path}/1 .*checksums are missing"):
      ckpt.restore(make_state(0, a_shape=BIG))
  assert step_dirs(str(tmp_path)) == [1]  # nothing to fall back to: nothing moves


@pytest.mark.parametrize("format_", ["morse_jax.rl.stbte/2", "morse_jax.rl.state/3", "", None])
def test_damaged_metadata_format_falls_back_to_the_newest_good_step(tmp_path, format_):
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    for s in (1, 2):
      ckpt.maybe_save(make_state(s, step=s, cursor=s))
  _set_format(tmp_path / "2", format_)
  before = files_under(str(tmp_path))
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=r"/2: metadata format .* is none of"):
      ckpt.restore(make_state(0), fallback=False)
    assert files_under(str(tmp_path)) == before
    assert_same(ckpt.restore(make_state(0)), make_state(1, step=1, cursor=1))
    assert list(ckpt.skipped) == [2] and "metadata format" in ckpt.skipped[2]
  (aside,) = damaged(tmp_path)
  assert files_under(str(tmp_path)) == {**moved(before, "2", aside), **reason(aside)}
  _set_format(tmp_path / "1", format_)
  before = files_under(str(tmp_path))
  with Checkpoints(str(tmp_path), every=1, keep=3, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=f"{tmp_path}/1: metadata format"):
      ckpt.restore(make_state(0))
  assert files_under(str(tmp_path)) == before


def test_files_fingerprint(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  (tmp_path / "w.bin").write_bytes(b"\0" * 100)
  first = files_fingerprint(str(tmp_path))
  assert first == files_fingerprint(str(tmp_path))
  os.utime(tmp_path / "w.bin", (0, 0))  # a copy or a fresh clone: same fingerprint
  assert files_fingerprint(str(tmp_path)) == first
  (tmp_path / "w.bin").write_bytes(b"\0" * 99 + b"\1")
  assert files_fingerprint(str(tmp_path)) != first
  assert files_fingerprint("") == "" and files_fingerprint(str(tmp_path / "no")).startswith(
      "missing:")


def test_pipeline_run_identity_has_seed_task_data_and_weights(tmp_path):
  """`make demo` then `make demo --config.seed=1` in one workdir: the second is another run."""
  from configs.morse import demo_cpu
  from morse_jax.experiments import pipeline
  from morse_jax.tasks.base import Problem

  config = demo_cpu.get_config()
  problems = [Problem("p0", "synthetic", "c", "add two numbers"),
              Problem("p1", "synthetic", "c", "sort a list")]
  base = pipeline.run_identity(config, META, problems)
  assert base["seed"] == 0 and base["task"]["family"] == config.task.family
  assert base["base_weights"]["files"] and not base["base_weights"]["files"].startswith("missing")
  config.seed = 1
  assert pipeline.run_identity(config, META, problems)["seed"] == 1
  config.seed = 0
  assert pipeline.run_identity(config, META, problems[::-1])["data"] != base["data"]
  config.train.steps += 10  # a longer run is the same run
  assert pipeline.run_identity(config, META, problems) == base
  with Checkpoints(str(tmp_path), every=1, keep=1, metadata=META, identity=base):
    pass
  config.seed = 1
  with pytest.raises(CheckpointError, match="seed is 0 there, 1 here"):
    Checkpoints(str(tmp_path), every=1, keep=1, metadata=META,
                identity=pipeline.run_identity(config, META, problems),
                continue_other_run=config.train.continue_other_run)


def test_a_key_this_version_no_longer_records_is_not_a_difference(tmp_path):
  """Steps and identity files written with a field since retired (the step config's remat
  before train_step.EXECUTION_ONLY) restore; a key only this version has is still refused."""
  old_meta = {**META, "step": {"lr": 0.1, "remat": False}}
  old_identity = {**IDENTITY, "trainer": old_meta}
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=old_meta,
                   identity=old_identity) as ckpt:
    ckpt.maybe_save(make_state(1, step=1))
  meta = {**META, "step": {"lr": 0.1}}
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=meta,
                   identity={**IDENTITY, "trainer": meta}) as ckpt:
    assert_same(ckpt.restore(make_state(0)), make_state(1, step=1))
  owner = json.loads((tmp_path / IDENTITY_FILE).read_text())
  assert owner["identity"]["trainer"] == meta and owner["continued"] == []
  # Its step records the old fingerprint, which the folder keeps as this run's own.
  assert owner["earlier_fingerprints"] == [fingerprint(old_identity)]
  with Checkpoints(str(tmp_path), every=1, keep=2, metadata=meta,
                   identity={**IDENTITY, "trainer": meta}) as ckpt:
    assert_same(ckpt.restore(make_state(0)), make_state(1, step=1))
  changed = {**META, "step": {"lr": 0.2}}
  with pytest.raises(CheckpointError, match="trainer.step.lr is 0.1 there, 0.2 here"):
    Checkpoints(str(tmp_path), every=1, keep=2, metadata=changed,
                identity={**IDENTITY, "trainer": changed})


# ------------------------------------------- damaged steps move aside; a step is its own


def test_a_step_skipped_on_resume_is_saved_again(tmp_path, caplog):
  """Resume falls back from the corrupt step 5 to 3 and trains on: step 5 is written again
  and restores (it was left on disk and the new save of 5 skipped)."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (3, 5):
      ckpt.maybe_save(make_state(s, step=s, cursor=s, a_shape=BIG))
  _flip_bit_in_array_data(os.path.join(tmp_path, "5"))
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert int(ckpt.restore(make_state(0, a_shape=BIG)).step) == 3
    assert any("moved damaged checkpoint step 5" in r.getMessage() and
               "does not match its checksum" in r.getMessage() for r in caplog.records)
    assert ckpt.latest_step() == 3
    for s in (4, 5):
      assert ckpt.maybe_save(make_state(10 + s, step=s, cursor=s, a_shape=BIG))
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert_same(ckpt.restore(make_state(0, a_shape=BIG)),
                make_state(15, step=5, cursor=5, a_shape=BIG))
  (aside,) = damaged(tmp_path)
  assert "does not match its checksum" in (tmp_path / "damaged" / aside.name /
                                           "reason.txt").read_text()


@pytest.mark.parametrize("keep", [3, 1])
def test_a_damaged_high_step_holds_no_keep_slot_and_is_never_deleted(tmp_path, keep):
  """A corrupt step 900 counted among the newest `keep`: keep 3 left [4, 5, 900] after saves
  3-5, keep 1 deleted every good save. Moved aside, it stays for a person to inspect."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (2, 900):
      ckpt.maybe_save(make_state(s, step=s, cursor=s))
  _truncate_state(os.path.join(tmp_path, "900"))
  with Checkpoints(str(tmp_path), every=1, keep=keep, metadata=META) as ckpt:
    assert int(ckpt.restore(make_state(0)).step) == 2
    for s in (3, 4, 5):
      assert ckpt.maybe_save(make_state(s, step=s, cursor=s))
    assert step_dirs(str(tmp_path)) == [3, 4, 5][-keep:]
    assert_same(ckpt.restore(make_state(0)), make_state(5, step=5, cursor=5))
  (aside,) = damaged(tmp_path)
  assert aside.name.startswith("900-") and os.path.isdir(os.path.join(aside.path, "900", "state"))


def test_a_renamed_step_directory_is_damaged(tmp_path):
  """Step 4's directory renamed 7 restored a state whose own step is 4 as step 7."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (2, 4):
      ckpt.maybe_save(make_state(s, step=s, cursor=s))
  os.rename(tmp_path / "4", tmp_path / "7")
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    with pytest.raises(CorruptCheckpointError, match=f"{tmp_path}/7: its state is step 4, not 7"):
      ckpt.restore(make_state(0), step=7)
    assert_same(ckpt.restore(make_state(0)), make_state(2, step=2, cursor=2))
    assert list(ckpt.skipped) == [7] and step_dirs(str(tmp_path)) == [2]


def _other_runs_step(tmp_path, identity) -> str:
  """Step 5 of another run of the same metadata, in its own folder."""
  other = str(tmp_path / "other")
  with Checkpoints(other, every=1, keep=5, metadata=META, identity=identity) as ckpt:
    ckpt.maybe_save(make_state(50, step=5, cursor=5))
  return os.path.join(other, "5")


@pytest.mark.parametrize("how", ["symlink", "copy"])
def test_another_runs_step_linked_or_copied_in_is_damaged(tmp_path, how):
  """Another run's step 5 (seed 1, same metadata) linked or copied into this run's folder
  restored silently; it is skipped as damaged and moved aside (a link moves as a link: the
  other run's step is untouched), by the run and by a reader without an identity."""
  mine = str(tmp_path / "mine")
  with Checkpoints(mine, every=1, keep=5, metadata=META, identity=IDENTITY) as ckpt:
    ckpt.maybe_save(make_state(2, step=2, cursor=2))
  theirs = _other_runs_step(tmp_path, {**IDENTITY, "seed": 1})
  why = "is a symbolic link" if how == "symlink" else \
      f"written by run {fingerprint({**IDENTITY, 'seed': 1})}.*another run's step"
  for identity in (None, IDENTITY):
    if how == "symlink":
      os.symlink(theirs, os.path.join(mine, "5"))
    else:
      shutil.copytree(theirs, os.path.join(mine, "5"))
    with Checkpoints(mine, every=1, keep=5, metadata=META, identity=identity) as ckpt:
      with pytest.raises(CorruptCheckpointError, match=why):
        ckpt.restore(make_state(0), step=5)
      assert_same(ckpt.restore(make_state(0)), make_state(2, step=2, cursor=2))
      assert list(ckpt.skipped) == [5]
    assert step_dirs(mine) == [2]
  asides = damaged(mine)
  assert len(asides) == 2 and all(os.path.lexists(os.path.join(a.path, "5")) for a in asides)
  with Checkpoints(str(tmp_path / "other"), every=1, keep=5, metadata=META,
                   identity={**IDENTITY, "seed": 1}) as ckpt:
    assert_same(ckpt.restore(make_state(0)), make_state(50, step=5, cursor=5))


def test_only_the_first_process_moves_a_damaged_step(tmp_path, monkeypatch):
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (1, 2):
      ckpt.maybe_save(make_state(s, step=s))
  _truncate_state(os.path.join(tmp_path, "2"))
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    assert int(ckpt.restore(make_state(0)).step) == 1
  assert step_dirs(str(tmp_path)) == [1, 2] and not damaged(tmp_path)


def test_two_restorers_move_a_damaged_step_once(tmp_path):
  """Restorers a and b both find step 5 damaged; while b restores step 3, a moves 5 aside and
  saves a new step 5. b must not move the new step 5 (nor fail)."""
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as ckpt:
    for s in (3, 5):
      ckpt.maybe_save(make_state(s, step=s, cursor=s))
  _truncate_state(os.path.join(tmp_path, "5"))
  new5 = make_state(55, step=5, cursor=5)
  with Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as a, \
       Checkpoints(str(tmp_path), every=1, keep=5, metadata=META) as b:
    restore_step = b._restore_step

    def slow(reader, step, *args):
      if step == 3:
        assert int(a.restore(make_state(0)).step) == 3 and a.maybe_save(new5)
      return restore_step(reader, step, *args)

    b._restore_step = slow
    assert int(b.restore(make_state(0)).step) == 3 and list(b.skipped) == [5]
    assert_same(b.restore(make_state(0), step=5), new5)
  assert len(damaged(tmp_path)) == 1 and step_dirs(str(tmp_path)) == [3, 5]
