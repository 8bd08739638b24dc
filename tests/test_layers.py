"""Package layering: lower layers never import higher ones (checked in a fresh interpreter)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package,forbidden", [
    ("morse_jax.llm", "morse_jax.lora"),
    # The update batch and its builder sit below the jitted step (issue 21).
    ("morse_jax.rl.rollout", "morse_jax.rl.train_step"),
    ("morse_jax.rl.compaction", "morse_jax.rl.train_step"),
    ("morse_jax.rl.batch", "morse_jax.rl.train_step"),
])
def test_package_does_not_import(package, forbidden):
  code = (f"import sys, {package}\n"
          f"bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))\n"
          "print(bad)\nsys.exit(1 if bad else 0)")
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, f"{package} imports {run.stdout.strip()}{run.stderr[-500:]}"
