"""Train MoRSE's experts and router with HGRPO (or GRPO) on a task family's training split.

  python -m launchers.train --config=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,gpu8 \
      --config.model.path=/ckpt/Qwen3-4B-Instruct-2507 --config.task.path=/data/scicode.json

Resumes from the latest checkpoint in <workdir>/ckpt. Multi-host: the same command on every host
with --config.distributed.* (or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or
--config.distributed.auto=True on a Cloud TPU / SLURM job); see launchers/cluster/.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)


def main(argv):
  del argv
  from morse_jax.experiments import pipeline

  if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if config.get("system") == "apex" and config.get("systems"):  # configs/apex/demo_vision.py
    from apex_jax import vision_demo

    vision_demo.run(config)
    return
  if config.get("system") == "apex" and config.get("seeds"):  # the chain once per seed
    from apex_jax import seeds

    seeds.run(config)
    return
  if config.get("system") == "apex":  # configs/apex/*: memory, three stages, TTRL, ablations
    from apex_jax import pipeline as apex_pipeline

    results = apex_pipeline.run(config)
    apex_pipeline.print_summary(results, config.workdir)
    return
  if config.get("table2") is not None:  # configs/morse/table2_cpu.py: five systems, seeds
    from morse_jax.experiments import table2

    table2.run(config)
    return
  if config.demo:  # before/after evaluation, table and plots
    pipeline.demo(config)
    return
  last = pipeline.train(config)
  pipeline.banner("done")
  for k in ("reward_mean", "best_candidate_pass", "problem_pass", "expert_loss"):
    if k in last:
      print(f"{k:<24} {last[k]:.4f}")


if __name__ == "__main__":
  app.run(main)
