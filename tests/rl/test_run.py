"""A run's identity (`rl.run.record`) is the record runs wrote before it existed, key for key:
computed here the old way (each caller's own dict and JSON round trip, as they stood before
issue 53) and the new way, for the MoRSE demo config, APEx's demo stages and its TTRL, so the
checkpoint folders of earlier runs still restore."""

from __future__ import annotations

import dataclasses
import json
import os
import types

import jax
import numpy as np
import pytest

from apex_jax import experiment as apex_experiment
from apex_jax.training import stages as stages_lib
from apex_jax.training import ttrl as ttrl_lib
from configs.apex import demo_cpu as apex_demo
from configs.morse import demo_cpu
from morse_jax.checkpoint.steps import files_fingerprint, fingerprint
from morse_jax.config_sections import settings
from morse_jax.experiments import experiment, pipeline
from morse_jax.llm.config import LlmConfig
from morse_jax.rl import run as run_lib
from morse_jax.rl.train_step import StepConfig

# ---- the old way (verbatim but for names) ---------------------------------------------------


def old_step_identity(step):
  return {k: v for k, v in dataclasses.asdict(step).items() if k not in ("micro_batches", "remat")}


def old_trainer_metadata(trainer):
  as_dict = dataclasses.asdict
  return {"model": as_dict(trainer.model.config), "lora": as_dict(trainer.lora),
          "router": None if trainer.router is None else as_dict(trainer.router),
          "step": old_step_identity(trainer.step_config),
          "rollout": old_rollout(trainer.rollout_config), "embed_dim": trainer.embed_dim}


def old_rollout(rollout):
  """A RolloutConfig as runs wrote it before it had `engine` (issue 55)."""
  return {k: v for k, v in dataclasses.asdict(rollout).items() if k != "engine"}


def old_run_identity(config, metadata, problems):
  data = fingerprint([[p.id, p.statement] for p in problems])
  return json.loads(json.dumps({
      "trainer": metadata, "seed": config.seed, "system": config.system,
      "mixture": config.get("mixture"), "algo": config.get("algo"),
      "task": config.task.to_dict(), "data": data,
      "base_weights": {"path": os.path.abspath(os.path.expanduser(config.model.path))
                                if config.model.path else "",
                       "files": files_fingerprint(config.model.path)}}))


def old_before_identity(config):
  return json.loads(json.dumps({
      "model": os.path.abspath(os.path.expanduser(config.model.path)),
      "task": config.task.to_dict(), "eval_max_new_tokens": config.eval.max_new_tokens,
      "system": config.system, "router_top_k": config.router.top_k}))


def old_rng(rng):
  raw = jax.random.key_data(rng) if jax.numpy.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
  return fingerprint(np.asarray(raw).tolist())


def old_phase(config):
  """A StageConfig or TtrlConfig as runs wrote it before it had micro_batches (issue 54)."""
  return {k: v for k, v in dataclasses.asdict(config).items() if k != "micro_batches"}


def old_stages_records(updater, stages, rng):
  meta = json.loads(json.dumps({
      "model": dataclasses.asdict(updater.model.config), "lora": dataclasses.asdict(updater.lora),
      "step": old_step_identity(updater.step),
      "stages": [old_phase(s.config) for s in stages]}))
  return meta, {"stages": meta, "rng": old_rng(rng)}


def old_ttrl_records(updater, config, queries, rng):
  meta = json.loads(json.dumps({
      "model": dataclasses.asdict(updater.model.config), "lora": dataclasses.asdict(updater.lora),
      "step": old_step_identity(updater.step), "ttrl": old_phase(config)}))
  # the old code fingerprinted astuple(query): the five fields a Query had before it carried images
  old_fields = [(q.question, q.caption, q.category, q.modality, q.data_id) for q in queries]
  return meta, {"ttrl": meta, "queries": fingerprint(old_fields),
                "rng": old_rng(rng)}


# ---- the comparison -------------------------------------------------------------------------


def same(old, new):
  """What Checkpoints stores (after its JSON normalisation) is byte for byte the old record."""
  old = json.loads(json.dumps(old))
  assert json.dumps(new) == json.dumps(old)
  assert fingerprint(new) == fingerprint(old)


def test_the_morse_demo_run_records_what_it_did():
  config = demo_cpu.get_config()
  exp = experiment.build(config)
  trainer = exp.trainer()
  problems = experiment.split(config, exp.problems, "train")
  same(old_trainer_metadata(trainer), trainer.metadata())
  same(old_run_identity(config, old_trainer_metadata(trainer), problems),
       pipeline.run_identity(config, trainer.metadata(), problems))
  same(old_before_identity(config), pipeline.before_identity(config))
  for algo, mixture in (("grpo", "mole"), ("grpo", "fixed")):  # the ablations' runs too
    config.algo, config.mixture = algo, mixture
    trainer = experiment.build(config).trainer()
    same(old_trainer_metadata(trainer), trainer.metadata())


@pytest.fixture(scope="module")
def apex_updater():
  """The demo config and what an updater built from it holds (no weights loaded)."""
  c = apex_demo.get_config()
  with open(os.path.join(c.model.path, "config.json")) as f:
    model = LlmConfig.from_hf_dict(json.load(f), c.model.path)
  return c, types.SimpleNamespace(model=types.SimpleNamespace(config=model),  # an llm.Model's
                                  lora=apex_experiment.lora_config(c),
                                  step=apex_experiment.train_config(c).step)


@pytest.mark.parametrize("rng", [jax.random.PRNGKey(3), jax.random.key(3)],
                         ids=["raw key", "typed key"])
def test_the_apex_demo_stages_and_ttrl_record_what_they_did(apex_updater, rng):
  c, updater = apex_updater
  stages = []
  for module in stages_lib.STAGE_ORDER:
    phase = settings(apex_experiment.StagePhase, c.stages[module], f"stages.{module}",
                     module=module)
    stages.append(stages_lib.Stage(phase.stage(37), ["x"], None))
  for old, new in zip(old_stages_records(updater, stages, rng),
                      stages_lib._records(updater, stages, rng)):  # pylint: disable=protected-access
    same(old, new)
  config = settings(apex_experiment.TtrlPhase, c.ttrl, "ttrl").ttrl(37)
  queries = [ttrl_lib.Query(f"q{i}", category="career", data_id=str(i)) for i in range(5)]
  for old, new in zip(old_ttrl_records(updater, config, queries, rng),
                      ttrl_lib._records(updater, config, queries, rng)):  # pylint: disable=protected-access
    same(old, new)


def test_a_record_part_by_kind():
  step = StepConfig(remat=True)
  got = run_lib.record(step=step, pair=(1, 2), key=jax.random.key(0), none=None)
  assert "remat" not in got["step"] and "micro_batches" not in got["step"]
  assert got["pair"] == [1, 2] and got["none"] is None
  assert got["key"] == run_lib.record(key=jax.random.PRNGKey(0))["key"]  # typed or raw: its data
