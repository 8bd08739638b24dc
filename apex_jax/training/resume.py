"""The checkpoints of one of APEx's resumable loops (the stages, TTRL): its orbax steps and their
sidecars (`morse_jax.checkpoint`: a step's history and counts, and with TTRL the memory bank's
snapshot), opened and restored from the newest sound step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.checkpoint.sidecar import Sidecar, restore_newest
from morse_jax.checkpoint.steps import Checkpoints, fingerprint
from morse_jax.rl.state import TrainState


def open_run(directory: str, *, experts, opt_states, rng, every: int, keep: int, metadata: dict,
             identity: dict, continue_other_run: bool = False, bank=None,
             sidecar_required: bool = True):
  """The checkpoints of one resumable loop (the stages, TTRL): (ckpt, sidecar, restored), where
  restored is None (nothing on disk) or (step, experts, opt_states, rng, payload) of the newest
  sound step (`restore_newest`). The directory belongs to one run: `identity` plus the key `rng`
  the loop starts from (the seed)."""
  raw_key = (jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
             else rng)
  ckpt = Checkpoints(directory, every=every, keep=keep, metadata=metadata,
                     identity={**identity, "rng": fingerprint(np.asarray(raw_key).tolist())},
                     continue_other_run=continue_other_run)
  sidecar = Sidecar(directory)
  template = TrainState(step=jnp.int32(0), experts=experts, router=None, opt_states=opt_states,
                        rng=rng, cursor=jnp.int32(0))
  try:
    found = restore_newest(ckpt, sidecar, template, bank=bank, sidecar_required=sidecar_required)
  except BaseException:
    ckpt.close()
    raise
  if found is None:
    return ckpt, sidecar, None
  state, payload = found
  return ckpt, sidecar, (int(state.step), state.experts, state.opt_states, state.rng, payload)
