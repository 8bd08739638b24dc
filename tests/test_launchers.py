"""The launchers' pipelines end to end on a tiny model: train, resume, evaluate the result."""

import json
import os

from configs.morse import common
from morse_jax.mas import pipeline
from morse_jax.rl import metrics
from tests import test_configs


def test_train_resume_and_evaluate(tmp_path):
  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", "scicode")
  config.model.path, config.model.dtype = folder, "float32"
  config.task.path = test_configs.DATA["scicode"]
  config.workdir = str(tmp_path / "run")
  config.lora.last_n_layers = 1
  config.router.dim = 8
  config.train.update(steps=2, tasks_per_step=1, routes_per_node=2, group_size=2,
                      max_new_tokens=4, checkpoint_every=1)
  config.eval.max_new_tokens = 4
  last = pipeline.train(config)
  assert "reward_mean" in last
  rows = metrics.read_jsonl(os.path.join(config.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows][-1] >= 2
  config.train.steps = int(rows[-1]["step"]) + 1  # one more batch after a resume
  pipeline.train(config)
  rows = metrics.read_jsonl(os.path.join(config.workdir, "metrics.jsonl"))
  assert sorted({r["step"] for r in rows}) == list(range(1, len(rows) + 1))
  summary = pipeline.evaluate(config, checkpoint=os.path.join(config.workdir, "ckpt"),
                              split="train")
  assert 0.0 <= summary["step_pass"] <= 1.0 and summary["tasks"] >= 1
  json.dumps(summary)
