"""A test's limit counts the program's CPU time, so machine load does not decide a reward; a
wall-clock limit still stops a program that sleeps or blocks, and one that switches off its own
CPU timer is stopped by the CPU time measured on its processes."""

import subprocess
import sys

import pytest

from morse_jax.execution import verifier
from morse_jax.tasks import scicode
from morse_jax.tasks import synthetic

PROGRAM = """
import signal, time
def spin(seconds):
  start = time.process_time()
  while time.process_time() - start < seconds:
    pass
  return 1
def nap(seconds):
  time.sleep(seconds)
  return 1
def forever():
  while True:
    pass
def unstoppable(seconds):
  signal.setitimer(signal.ITIMER_PROF, 0)
  return spin(seconds)
"""


# Where a test must be stopped by its CPU limit, the wall limit is far off: on a loaded machine
# (a niced test run gets a tenth of a core or less) 1 s of CPU time takes 10 s or more.
FAR = 60.0


def _run(tests, cpu=1.0, wall=5.0, timeout_s=120.0):
  return verifier.run_tests(PROGRAM, tests, timeout_s=timeout_s, per_test_timeout_s=cpu,
                            per_test_wall_s=wall)


def test_the_limit_counts_cpu_time_not_wall_time():
  """1.5 s asleep is over a 1 s limit in wall time, but no CPU time: it passes."""
  run = _run(["assert nap(1.5) == 1"])
  assert (run.passed, run.total) == (1, 1), run.errors


def test_a_program_that_sleeps_is_stopped_by_the_wall_limit():
  run = _run(["assert nap(10) == 1", "assert spin(0.1) == 1"], wall=3.0)
  assert (run.passed, run.total) == (1, 2), run.errors
  assert "wall-clock" in run.errors[0] and "CPU" not in run.errors[0], run.errors


def test_an_infinite_loop_is_stopped_by_the_cpu_limit():
  run = _run(["assert forever() == 1", "assert spin(0.1) == 1"], wall=FAR)
  assert (run.passed, run.total) == (1, 2), run.errors
  assert "CPU time limit" in run.errors[0] and "wall-clock" not in run.errors[0], run.errors


def test_the_cpu_limit_covers_all_calls_of_a_test():
  """Each call is under the limit; together they are over it. The next test starts afresh."""
  run = _run(["for _ in range(8):\n  assert spin(0.2) == 1", "assert spin(0.5) == 1"],
             wall=FAR)
  assert (run.passed, run.total) == (1, 2), run.errors
  assert "CPU time limit" in run.errors[0], run.errors


def test_a_loop_in_the_tests_own_code_is_stopped_by_the_cpu_limit():
  run = _run(["while True:\n  pass", "assert spin(0.1) == 1"], wall=FAR)
  assert (run.passed, run.total) == (1, 2), run.errors
  assert "CPU time limit" in run.errors[0], run.errors


def test_a_program_that_stops_its_own_timer_is_stopped_by_its_measured_cpu_time():
  run = _run(["assert unstoppable(2.5) == 1"], wall=FAR)
  assert (run.passed, run.total) == (0, 1), run.errors
  assert "measured on its processes" in run.errors[0], run.errors
  honest = _run(["assert unstoppable(0.3) == 1"])  # the guard does not cut a fast program
  assert (honest.passed, honest.total) == (1, 1), honest.errors


def test_a_cpu_bound_program_is_not_cut_on_a_loaded_machine():
  """0.6 s of CPU under a 1 s CPU limit while three busy loops compete for the cores: its wall
  time may well pass 1 s, its CPU time does not."""
  hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
  try:
    run = _run(["assert spin(0.6) == 1"], wall=FAR)
  finally:
    for hog in hogs:
      hog.kill()
      hog.wait()
  assert (run.passed, run.total) == (1, 1), run.errors


def test_per_test_limits_default_and_checks():
  assert verifier.per_test_limits(None) == {}
  assert verifier.per_test_limits(2.0) == {"cpu": 2.0, "wall": 12.0}
  assert verifier.per_test_limits(100.0) == {"cpu": 100.0, "wall": 400.0}
  assert verifier.per_test_limits(1.0, 5.0) == {"cpu": 1.0, "wall": 5.0}
  assert verifier.per_test_limits(None, 5.0) == {"wall": 5.0}
  for cpu, wall, field in ((0.0, None, "per_test_timeout_s"), (-1.0, None, "per_test_timeout_s"),
                           (float("nan"), None, "per_test_timeout_s"),
                           (True, None, "per_test_timeout_s"), (1.0, "5", "per_test_wall_s"),
                           (1.0, float("inf"), "per_test_wall_s"), (2.0, 1.0, "per_test_wall_s")):
    with pytest.raises(ValueError, match=field):
      verifier.per_test_limits(cpu, wall)


def test_the_families_check_their_limits():
  with pytest.raises(ValueError, match="per_test_wall_s=0.5"):
    synthetic.Synthetic(per_test_wall_s=0.5)
  with pytest.raises(ValueError, match="per_test_timeout_s=-1"):
    scicode.SciCode(per_test_timeout_s=-1)
  assert synthetic.Synthetic(per_test_wall_s=30.0).per_test_wall_s == 30.0
