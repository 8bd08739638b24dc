"""TrainState checkpoints: exact round trip, every/keep, run-identity checks, corrupt steps."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from morse_jax.rl.state import CheckpointError, Checkpoints, TrainState

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
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path}/4") as err:
      ckpt.restore(make_state(0, a_shape=BIG))
    assert err.value.__cause__ is not None or "missing" in str(err.value)
    assert files_under(str(tmp_path)) == before  # a failed restore changes nothing
    older = ckpt.restore(make_state(0, a_shape=BIG), step=2)
    assert_same(older, make_state(2, step=2, cursor=2, a_shape=BIG))
    # Training on from step 2: step 4 exists (corrupt) and is not overwritten; 6 is new.
    assert not ckpt.maybe_save(make_state(4, step=4, a_shape=BIG))
    assert ckpt.maybe_save(make_state(6, step=6, cursor=6, a_shape=BIG))
    assert step_dirs(str(tmp_path)) == [2, 4, 6]
    assert_same(ckpt.restore(make_state(0, a_shape=BIG), step=2), older)
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
