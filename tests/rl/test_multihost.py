"""Two local processes with 4 fake CPU devices each give the same update, and the same training
steps (sampling included), as one process with 8."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from morse_jax.rl import distributed
from tests.rl import multihost_case

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow  # two processes start JAX and compile: 40 s alone, near the default budget
@pytest.mark.parametrize("trainer", [False, True])
def test_two_processes_equal_one(eight_devices, trainer):
  """The update alone; with `trainer`, also two whole Trainer steps (about 2 min)."""
  from morse_jax.llm import sharding

  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["JAX_PLATFORMS"] = "cpu"
  extra = ["trainer"] if trainer else []
  procs = [subprocess.Popen([sys.executable, "-m", "tests.rl.multihost_case", str(i), str(port),
                             *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for i in range(2)]
  mesh = sharding.make_mesh(8, 1)
  place = sharding.shard_rows(mesh)
  ref = multihost_case.run_step(mesh, lambda x: place(x)[0])
  ref_trainer = multihost_case.run_trainer(mesh) if trainer else None
  outputs = []
  for p in procs:
    try:
      outputs.append(p.communicate(timeout=240)[0])
    finally:
      p.kill()
  assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
  line = next(l for l in outputs[0].splitlines() if l.startswith("RESULT "))
  result = json.loads(line[len("RESULT "):])
  got = result["step"]
  assert got["skipped"] == 0 and ref["expert_b_sum"] > 0
  for key in ("expert_loss", "router_loss", "expert_grad_norm", "router_grad_norm",
              "expert_b_sum"):
    np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, err_msg=key)
  if not trainer:
    return
  got = result["trainer"]
  assert ref_trainer["expert_b_sum"] > 0 and len(got["history"]) == 2
  for got_row, ref_row in zip(got["history"], ref_trainer["history"]):
    assert got_row.keys() == ref_row.keys()
    for key in ref_row:  # the same samples and rewards, then the same update
      np.testing.assert_allclose(got_row[key], ref_row[key], rtol=1e-5, atol=1e-6, err_msg=key)
  np.testing.assert_allclose(got["expert_b_sum"], ref_trainer["expert_b_sum"], rtol=1e-5)


def test_initialize_checks_its_arguments(monkeypatch):
  for name in distributed.ENV:
    monkeypatch.delenv(name, raising=False)
  assert distributed.initialize() is False  # nothing given: a single-process run
  with pytest.raises(ValueError, match="num_processes, process_id missing"):
    distributed.initialize("127.0.0.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
    distributed.initialize()
  with pytest.raises(ValueError, match=r"process_id=2 is outside \[0, num_processes=2\)"):
    distributed.initialize("127.0.0.1:1234", 2, 2)
  assert distributed.initialize("127.0.0.1:1234", 1, 0) is False
