"""APEx's comparison systems (the paper's ReAct, memory-RAG, ExpeL, Memento and plan-only rows),
as ECNU-SII/MIA runs them, on APEx's agents, search tool, memory bank, judges and metrics:
`systems` (their episodes), `expel` (ExpeL's rule bank), `rows` (memory building and the
evaluation rows; config.eval.baselines, configs/apex/baselines.py). Their wording is MIA's, in
`apex_jax.agents.baseline_prompts` beside APEx's prompts (the toy's drills render them too)."""

from apex_jax.baselines.rows import baseline_names, baseline_rows, build_memory, evaluate_system
from apex_jax.baselines.systems import MEMORY_SYSTEMS, SYSTEMS, Parts, Run, run_system

__all__ = ["MEMORY_SYSTEMS", "Parts", "Run", "SYSTEMS", "baseline_names", "baseline_rows",
           "build_memory", "evaluate_system", "run_system"]
