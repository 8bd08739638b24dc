"""The paper's ablation table: which rows exist and what system each evaluates
(`apex_jax.pipeline` runs them: `ablations`, `run`).

Each row runs on the test questions with EM, F1, answered rate and context tokens per episode
(`config.eval.ablations`, default all of ABLATIONS):
  full                          the experts after TTRL, the bank as TTRL left it
  without_memories / _skills    the same, the planner shown no instance memory / no skill
  without_memories_and_skills   neither
  without_ttrl                  the experts after the stages, the bank snapshotted before TTRL
  without_iteration             the experts after TTRL, the bank one memory-building pass left
                                before any evolution: its memories, no skill document, nothing
                                TTRL added (evolution and TTRL's additions are the iterations)
  without_<module>_training     the system that module's training was left out of: its role
                                adapter the initial one (each stage trains only its own role,
                                TTRL only the planner's), and, when TTRL runs, the bank that
                                system's TTRL builds: TTRL rerun from the bank before TTRL with
                                the module's initial adapter (`rebuilt_module_rows`) -- distiller:
                                its summaries and skill evolution untrained, the planner trained
                                by TTRL as in full; executor: TTRL's episodes executed untrained,
                                the planner trained by TTRL; planner: TTRL's episodes, stored
                                and evolved, with the planner never updated (FrozenUpdater).
                                Memory building runs the untrained system, so its bank is every
                                row's; what is not rerun: the planner stage, whose rollouts ran
                                the trained executor (w/o executor keeps the planner it trained).
                                Without TTRL (or eval.rebuild_module_banks False) the row swaps
                                the adapter into the full system and reads the full bank.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from apex_jax.training.grpo import keep_only_expert

ABLATIONS = ("full", "without_memories", "without_skills", "without_memories_and_skills",
             "without_ttrl", "without_iteration", "without_executor_training",
             "without_distiller_training", "without_planner_training")


@dataclasses.dataclass
class AblationInputs:
  """What the ablation rows read (module docstring): the experts before the stages, after them
  and after TTRL, and the bank snapshots (files; None where no row asked for one)."""
  initial: Any  # every module's adapter as its stage started (a stage trains only its own role)
  staged: Any
  final: Any
  one_pass_bank: str | None = None  # memory_build's episodes stored, before any evolution
  before_ttrl_bank: str | None = None
  # without_<module>_training -> (experts, bank file) of TTRL rerun with that module untrained
  # (`rebuilt_module_rows`); a row absent here swaps the adapter into the full system
  rebuilt: dict = dataclasses.field(default_factory=dict)


def ablation_names(config) -> tuple[str, ...]:
  """config.eval.ablations (empty or absent: all of ABLATIONS), checked."""
  names = tuple(config.eval.get("ablations") or ABLATIONS)
  unknown = [n for n in names if n not in ABLATIONS]
  if unknown:
    raise ValueError(f"config.eval.ablations {unknown[0]!r} not in {ABLATIONS}")
  return tuple(dict.fromkeys(names))


def row_module(name: str) -> str:
  """The module of a without_<module>_training row."""
  return name[len("without_"):-len("_training")]


def rebuilt_module_rows(config, names) -> tuple[str, ...]:
  """The without_<module>_training rows among `names` whose bank is rebuilt: all of them when
  TTRL runs (its episodes, summaries and evolution run on every module, so the bank the full
  system evaluates with depends on each) and config.eval.rebuild_module_banks (default True);
  none otherwise. Memory building runs the untrained system, so its bank is every row's."""
  t = config.ttrl
  if not (t.steps or t.get("epochs")) or not config.eval.get("rebuild_module_banks", True):
    return ()
  return tuple(n for n in names if n.endswith("_training"))


def untrained_module(experts, initial, lora, module: str):
  """`experts` with `module`'s role adapter taken from `initial` (the others kept)."""
  return keep_only_expert(initial, experts, lora.role_index(module))


def ablation_system(name: str, inputs: AblationInputs, lora) -> tuple[Any, str | None, bool,
                                                                      bool]:
  """(experts, bank snapshot file or None for the live bank, use_memories, use_skills)."""
  if name not in ABLATIONS:
    raise ValueError(f"ablation {name!r} not in {ABLATIONS}")
  if name in inputs.rebuilt:
    experts, path = inputs.rebuilt[name]
    return experts, path, True, True
  if name.endswith("_training"):
    return untrained_module(inputs.final, inputs.initial, lora, row_module(name)), None, True, \
        True
  if name in ("without_ttrl", "without_iteration"):
    path = inputs.before_ttrl_bank if name == "without_ttrl" else inputs.one_pass_bank
    if path is None:
      raise ValueError(f"ablation {name!r} needs its bank snapshot (AblationInputs)")
    return (inputs.staged if name == "without_ttrl" else inputs.final), path, True, True
  return (inputs.final, None, name not in ("without_memories", "without_memories_and_skills"),
          name not in ("without_skills", "without_memories_and_skills"))
