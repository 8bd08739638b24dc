"""The without_<module>_training rows evaluate the system they name: TTRL rerun with that
module's initial adapter builds the row's bank, so a row differs from "full" through the bank
as well as through the adapter.

The scripted system leaves a trace of who built each memory: every module writes a marker word
that says whether its adapter was trained (differs from the initial one):
  planner   plan "w30" trained / "w31" untrained, followed by the words w5x w6x w7x of the
            memories it was shown (copied from its context E(q))
  executor  thinks "w40" / "w41" and repeats the plan's own marker (w30 / w31)
  distiller a workflow summary "w5d w6e w7p": d 0 when the distiller is trained, e 0 when the
            trace has a trained executor's w40, p 0 when it has a trained planner's w30
(Words are whitespace-separated: the test tokenizer knows only w0, w1, ... as whole words.)
The executor answers after one search when its prompt holds w50, w60 and w70 (a memory the
fully trained system wrote, shown to the planner), else it searches once more: a row whose bank
lacks such memories spends more context tokens per episode than "full".
"""

import json
import re

import jax
import numpy as np
import pytest

from apex_jax import experiment, pipeline
from apex_jax.memory import CATEGORIES, MODALITIES, Bucket, MemoryBank
from apex_jax.tools import render_tool_call
from apex_jax.training import judging
from apex_jax.training.stages import STAGE_ORDER
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder
from tests.apex.test_experiment import SKILL, _FakeChat, small_config, tiny_model  # noqa: F401

ROWS = tuple(f"without_{m}_training" for m in STAGE_ORDER)


def _words(text: str) -> set[str]:
  return set(re.findall(r"\bw\d+\b", text))


def reply(module, prompt, call, trained):
  words = _words(prompt)
  if module == "distiller":
    if "<|system|>" in prompt:
      return json.dumps(SKILL)
    return (f"1. w5{0 if trained['distiller'] else 1} w6{0 if 'w40' in words else 1} "
            f"w7{0 if 'w30' in words else 1}")
  if module == "planner":
    if prompt.count("<|assistant|>") > 1:
      return "no"
    shown = sorted(w for w in words if re.fullmatch(r"w[567][01]", w))
    return f"<think> w20 </think> w3{0 if trained['planner'] else 1} {' '.join(shown)}"
  turn = prompt.count("<|assistant|>")
  own = "w30" if "w30" in words else "w31"
  think = f"<think> w4{0 if trained['executor'] else 1} {own} </think> "
  if turn == 1 or (turn == 2 and not {"w50", "w60", "w70"} <= words):
    return think + render_tool_call([f"w2{turn} w21"])
  return think + "<answer> w7 </answer>"


class ExpertAware(fakes.ScriptedGenerator):
  """A scripted generator whose reply sees which role adapters differ from `initial`."""

  initial = None
  roles = ()

  def trained(self, module: str) -> bool:
    if self.experts is None or self.initial is None:
      return False
    k = self.roles.index(module)
    return any(not np.array_equal(np.asarray(a)[:, k], np.asarray(b)[:, k])
               for a, b in zip(jax.tree.leaves(self.experts), jax.tree.leaves(self.initial)))

  def generate(self, module, prompts, **kw):
    trained = {m: self.trained(m) for m in self.roles}
    real = self.reply
    self.reply = lambda mod, prompt, call: real(mod, prompt, call, trained)
    try:
      return super().generate(module, prompts, **kw)
    finally:
      self.reply = real


class _Staged:
  def __init__(self, experts):
    self.experts, self.history = experts, []


@pytest.fixture
def run_rows(tiny_model, tmp_path, monkeypatch):  # noqa: F811
  """pipeline.run on the scripted system, the stages replaced by every role trained (+1)."""
  built = {}

  def build(c, **_):
    gen = ExpertAware(reply)
    gen.experts = None
    exp = experiment.build(c, model=tiny_model, generator=gen, embedder=HashEmbedder(64))
    gen.initial, gen.roles = exp.experts, exp.updater.lora.roles
    built["exp"] = exp
    return exp

  monkeypatch.setattr(pipeline, "build", build)
  monkeypatch.setattr(pipeline, "run_stages",
                      lambda updater, experts, *a, **kw: _Staged(
                          jax.tree.map(lambda x: x + 1.0, experts)))
  monkeypatch.setattr(judging, "judge_chat", lambda exp: _FakeChat())
  monkeypatch.setattr(pipeline, "export_adapters", lambda *a: {})

  def run(**eval_overrides):
    c = small_config(tmp_path, untrained=False, ablations=("full",) + ROWS, **eval_overrides)
    c.memory_build.update(questions=2, batch_size=2)
    c.ttrl.update(steps=1, batch_size=2, group_size=2)
    c.eval.update(questions=2, batch_size=2)
    return pipeline.run(c), built["exp"]
  return run


def _summaries(path: str) -> set[str]:
  """The workflow summaries a bank file holds."""
  bank = MemoryBank(path, HashEmbedder(64))
  try:
    return {m.workflow_summary for cat in CATEGORIES for mod in MODALITIES
            for m in bank.memories(Bucket(cat, mod))}
  finally:
    bank.close()


def test_each_module_row_evaluates_with_the_bank_its_untrained_module_builds(run_rows):
  results, exp = run_rows()
  rows = results["eval"]
  summaries = {name: _summaries(exp.bank.path if row["bank"]["path"] == "live" else
                                row["bank"]["path"]) for name, row in rows.items()}
  built_by_untrained = "1. w51 w61 w71"  # memory building runs the untrained system
  assert built_by_untrained in summaries["full"]
  # TTRL's memories: the full system's, and each row's with its own module untrained
  expected = {"full": "1. w50 w60 w70", "without_distiller_training": "1. w51 w60 w70",
              "without_executor_training": "1. w50 w61 w70",
              "without_planner_training": "1. w50 w60 w71"}
  for name, summary in expected.items():
    assert summaries[name] == {built_by_untrained, summary}, name
    assert rows[name]["bank"]["memories"] == rows["full"]["bank"]["memories"], name
  for name in ROWS:  # the row's bank lacks the fully trained system's memories: longer episodes
    assert rows[name]["context_tokens"] > rows["full"]["context_tokens"], name
    assert set(results["ablation_ttrl"][name]) == {"history", "judge_failures"}
    assert len(results["ablation_ttrl"][name]["history"]) == 1
  assert results["ablation_ttrl"]["without_planner_training"]["history"][0]["frozen"] == 1.0
  assert "ablation_ttrl" in results["seconds"]


def test_without_rebuilt_banks_the_module_rows_read_the_full_bank(run_rows):
  """eval.rebuild_module_banks False: the adapter swapped into the full system (no TTRL rerun),
  so with this bank-driven executor every row spends what full spends."""
  results, _ = run_rows(rebuild_module_banks=False)
  rows = results["eval"]
  assert "ablation_ttrl" not in results
  for name in ROWS:
    assert rows[name]["bank"] == rows["full"]["bank"], name
    assert rows[name]["context_tokens"] == rows["full"]["context_tokens"], name
