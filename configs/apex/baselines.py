"""APEx's comparison systems (ReAct, memory-RAG, ExpeL, Memento, plan-only: apex_jax.baselines)
beside APEx on the procedure demo's three worlds: the whole demo (configs/apex/demo_procedures.py:
memory building, stages, TTRL, its rows full / without memories / skills / both and untrained),
then one row per system named in the argument (comma-separated; none: all five), each on the
initial experts with its own bank built from its own episodes; seeds side by side with the order
"full above <system>" counted per seed and tested over the pooled questions (apex_jax.seeds).

Every row runs on `assets/toy_apex_mia`: the demo's toy (`assets/toy_apex`) also taught the
comparison systems' prompt forms (`apex_jax.toy.mia_forms`: Memento's plan from its cases, ExpeL's
rule call, the executor with a rule) from the same worlds and gold runs as APEx's, so that no
system's row is a format the toy never saw (issue 57 item 3). `--config.model.path=<folder>`
runs them on another model (the demo's toy: the table measured before the drills).

  python -m launchers.train --config=configs/apex/baselines.py:react,rag,expel,memento,plan_only
  python -m launchers.train --config=configs/apex/baselines.py:react     # one system
"""

import os

from apex_jax.baselines import SYSTEMS
from apex_jax.baselines.systems import check_system
from configs.apex import demo_cpu, demo_procedures

MIA_TOY = os.path.join(demo_cpu.ROOT, "assets", "toy_apex_mia")


def get_config(arg=None):
  names = tuple(check_system(n.strip()) for n in (arg or ",".join(SYSTEMS)).split(",")
                if n.strip())
  c = demo_procedures.get_config(MIA_TOY)
  c.workdir = "/tmp/apex_runs/baselines_" + "_".join(names)
  c.eval.baselines = names
  return c
