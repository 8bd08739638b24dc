"""One agent's run on one question, as the trainer needs it: token segments (generated turns carry
sampling log-probs and are trained on; prompts and tool output carry none and never are), the
generated text for judges, the final answer, and counters.

`morse_jax.rl.rollout.pack([traj.segments for traj in trajs])` gives loss_mask 1 exactly on the
generated tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from morse_jax.rl.rollout import Segment

MODULES = ("planner", "executor", "distiller")


@dataclasses.dataclass
class Trajectory:
  module: str  # one of MODULES
  segments: list[Segment]  # prompt, turn 1 (log-probs), tool output 1 (none), turn 2, ...
  text: str  # the generated text of all turns, for judges
  answer: str | None  # executor's <answer>, planner's plan / decision text, distiller's reply
  stats: dict[str, float] = dataclasses.field(default_factory=dict)  # turns, tool_calls, ...
  info: dict[str, Any] = dataclasses.field(default_factory=dict)  # per-module extras (queries)

  def __post_init__(self):
    if self.module not in MODULES:
      raise ValueError(f"Trajectory.module {self.module!r} not in {MODULES}")

  def generated_tokens(self) -> int:
    """Tokens the policy generated (the trained ones)."""
    return sum(len(s.tokens) for s in self.segments if s.logprobs is not None)

  def total_tokens(self) -> int:
    return sum(len(s.tokens) for s in self.segments)
