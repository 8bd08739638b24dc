"""Training metrics: pure helpers (numpy in, floats out) and a writer for JSONL, TensorBoard, tqdm.

The writer logs on process 0 only. Each `write` appends one JSON line `{"step": s, ...}` to
`<logdir>/metrics.jsonl` and flushes it, so a killed run keeps every line it wrote. Non-finite
values go to TensorBoard as they are but become JSON null (strict JSON has no NaN/Infinity).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax import atomic
from morse_jax.rl.advantages import MIN_REWARD_STD, flat_nodes

JSONL_NAME = "metrics.jsonl"
# Keys shown in the progress bar, with their short labels and formats.
_POSTFIX = (("reward_mean", "reward", "{:.3f}"), ("expert_loss", "loss", "{:.4g}"),
            ("tokens_per_s", "tok/s", "{:.0f}"))


# ------------------------------------------------------------------------------- pure helpers


def reward_stats(rewards: np.ndarray, group: np.ndarray, min_std: float = MIN_REWARD_STD,
                 flat=None) -> dict[str, float]:
  """Reward summary over all rows and per group (one group = one DAG node's B*M samples).

    reward_mean = mean_i r_i,   reward_std = sqrt(mean_i (r_i - reward_mean)^2)  (ddof 0),
    frac_reward_zero_std = |{g : std(r_i : group_i = g) < min_std}| / |groups|.

  The last is the update's own rule (`advantages.flat_nodes`: float32, the step's min_std): a
  group below it gets advantage 0 everywhere, so it is the fraction of wasted groups. `flat`:
  that rule's result per group (in sorted group order), when the update has it already.
  """
  r = np.asarray(rewards, np.float64)
  g = np.asarray(group)
  if r.ndim != 1 or g.shape != r.shape:
    raise ValueError(f"rewards and group must both be [n]; got {r.shape} and {g.shape}")
  if r.size == 0:
    raise ValueError("reward_stats needs at least one reward")
  ids, inverse = np.unique(g, return_inverse=True)
  if flat is None:
    flat = flat_nodes(r, inverse.astype(np.int32), np.ones(r.size, np.float32),
                      num_nodes=ids.size, routes_per_node=1, min_std=min_std)
  elif len(flat) != ids.size:
    raise ValueError(f"reward_stats: flat has {len(flat)} entries for {ids.size} groups")
  return {
      "reward_mean": float(r.mean()),
      "reward_std": float(r.std()),
      "frac_reward_zero_std": float(np.mean(flat)),
  }


def expert_usage(expert_sets: Sequence[Sequence[int]], num_experts: int) -> np.ndarray:
  """counts[e] = |{rows r : e in expert_sets[r]}|, an int64 array [num_experts].

  An expert listed twice in one row counts once for that row.
  """
  counts = np.zeros(num_experts, np.int64)
  for row, experts in enumerate(expert_sets):
    used = set()
    for e in experts:
      e = int(e)
      if not 0 <= e < num_experts:
        raise ValueError(f"expert_sets[{row}] has expert id {e}, outside [0, {num_experts})")
      used.add(e)
    for e in used:
      counts[e] += 1
  return counts


def tokens_per_second(num_tokens: int, seconds: float) -> float:
  """Throughput num_tokens / seconds; 0.0 when seconds <= 0 (nothing timed yet)."""
  return float(num_tokens) / seconds if seconds > 0 else 0.0


# ------------------------------------------------------------------------------------- JSONL


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """Every record of a metrics.jsonl file, in order.

  A last line cut short by a crash (no trailing newline, not valid JSON) is skipped; any other
  bad line raises ValueError with its line number.
  """
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as err:
      if i == len(lines) - 1:  # torn final line: the run died mid-write
        break
      raise ValueError(f"{path}:{i + 1}: not a JSON line: {line[:80]!r}") from err
  return records


def _truncate_jsonl(path: str, resume_step: int) -> None:
  """Keep only records with step <= resume_step, replacing the file atomically."""
  kept = [r for r in read_jsonl(path) if r.get("step", math.inf) <= resume_step]
  atomic.write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept),
                    ".metrics.")


def _drop_torn_tail(path: str) -> None:
  """Cuts a final line left without its newline by a crash, so appended records parse."""
  with open(path, "rb+") as f:
    data = f.read()
    if data and not data.endswith(b"\n"):
      f.truncate(data.rfind(b"\n") + 1)


# ------------------------------------------------------------------------------------ writer


def _is_ml_float(dtype: np.dtype) -> bool:
  """bfloat16, float8_* and friends (ml_dtypes) have numpy kind 'V' but are real floats."""
  return dtype.kind == "V" and bool(jax.dtypes.issubdtype(dtype, jnp.floating))


def _flatten(metrics: Mapping[str, Any]) -> dict[str, float]:
  """name -> float; an array of rank >= 1 becomes name/0, name/1, ... (raveled, row-major)."""
  out: dict[str, float] = {}
  for key, value in metrics.items():
    if not isinstance(key, str):
      raise ValueError(f"metric keys must be strings; got {key!r}")
    if key == "step":
      raise ValueError("metric key 'step' is reserved; pass the step as write()'s argument")
    try:
      arr = np.asarray(value)
    except Exception as err:  # e.g. a ragged list
      raise ValueError(f"metric {key!r} is not numeric: {value!r}") from err
    if arr.dtype.kind not in "biuf" and not _is_ml_float(arr.dtype):
      raise ValueError(f"metric {key!r} is not numeric: {value!r} (dtype {arr.dtype})")
    if arr.ndim == 0:
      out[key] = float(arr)
    else:
      for i, v in enumerate(arr.ravel()):
        out[f"{key}/{i}"] = float(v)
  return out


def _postfix(flat: Mapping[str, float]) -> dict[str, str]:
  """The progress bar's short selection: reward, loss, tok/s, whichever are present."""
  return {label: (fmt.format(flat[key]) if math.isfinite(flat[key]) else str(flat[key]))
          for key, label, fmt in _POSTFIX if key in flat}


class MetricsWriter:
  """Logs one dict of scalars per step to JSONL, TensorBoard and a tqdm bar, on process 0 only.

  Pass values that are addressable on process 0 (host scalars, or replicated jax arrays).
  With resume_step, lines of a killed earlier run with step > resume_step are dropped from
  metrics.jsonl first, and TensorBoard is told to purge its events from resume_step + 1 on.
  """

  def __init__(self, logdir: str | None, *, total_steps: int | None = None, jsonl: bool = True,
               tensorboard: bool = True, progress: bool = True, process_index: int | None = None,
               resume_step: int | None = None):
    self.logdir = logdir
    self.nonfinite_count = 0
    self.active = (jax.process_index() if process_index is None else process_index) == 0
    self._jsonl = None
    self._tb = None
    self._bar = None
    if not self.active:
      return
    if logdir is not None and (jsonl or tensorboard):
      os.makedirs(logdir, exist_ok=True)
    if logdir is not None and jsonl:
      path = os.path.join(logdir, JSONL_NAME)
      if os.path.exists(path):
        if resume_step is not None:
          _truncate_jsonl(path, resume_step)
        else:
          _drop_torn_tail(path)
      self._jsonl = open(path, "a", encoding="utf-8")
    if logdir is not None and tensorboard:
      import tensorboardX  # pylint: disable=import-outside-toplevel

      purge = None if resume_step is None else resume_step + 1
      self._tb = tensorboardX.SummaryWriter(logdir, purge_step=purge)
    if progress:
      import tqdm  # pylint: disable=import-outside-toplevel

      self._bar = tqdm.tqdm(total=total_steps, initial=resume_step or 0, unit="step",
                            dynamic_ncols=True)

  @property
  def jsonl_path(self) -> str | None:
    return None if self.logdir is None else os.path.join(self.logdir, JSONL_NAME)

  def write(self, step: int, metrics: Mapping[str, float | int | np.ndarray | jax.Array]) -> None:
    """Logs metrics at step. Raises ValueError naming the key if a value is not numeric."""
    if not self.active:
      return
    step = int(step)
    flat = _flatten(metrics)
    if self._jsonl is not None:
      record: dict[str, Any] = {"step": step}
      for key, v in flat.items():
        if math.isfinite(v):
          record[key] = v
        else:
          record[key] = None
          self.nonfinite_count += 1
      self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
      self._jsonl.flush()
    else:
      self.nonfinite_count += sum(not math.isfinite(v) for v in flat.values())
    if self._tb is not None:
      for key, v in flat.items():
        self._tb.add_scalar(key, v, global_step=step)
    if self._bar is not None:
      self._bar.set_postfix(_postfix(flat), refresh=False)
      if step >= self._bar.n:
        self._bar.update(step - self._bar.n)
      else:
        self._bar.n = step
        self._bar.refresh()

  def flush(self) -> None:
    if self._jsonl is not None:
      self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes every sink; safe to call twice."""
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
