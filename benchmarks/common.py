"""What every benchmark shares: the machine description and the JSON report."""

from __future__ import annotations

import json
import os
import platform


def write_report(name: str, out: str | None, **fields) -> dict:
  """Adds machine and library versions to `fields`, writes JSON to `out` when given."""
  import jax
  import torch

  report = {"benchmark": name, "machine": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "jax": jax.__version__, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "backend": jax.default_backend(), **fields}
  if out:
    with open(out, "w") as f:
      json.dump(report, f, indent=2)
    print(f"wrote {out}")
  return report
