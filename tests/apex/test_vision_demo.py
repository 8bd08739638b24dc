"""The vision demo's table (apex_jax.vision_demo, configs/apex/demo_vision.py): every system's
`full` row per seed, the two comparisons counted per seed and tested over the pooled questions;
scripted chains."""

from __future__ import annotations

import json

import pytest

from apex_jax import vision_demo
from configs.apex import demo_vision

# per system, the F1 of questions q0 and q1 on every seed
F1 = {"tool,text_image": (1.0, 1.0), "tool,no_text_image": (1.0, 0.0),
      "no_tool,text_image": (0.0, 0.0), "no_tool,no_text_image": (0.0, 0.5)}


def scripted(c):
  name = c.workdir.split("/")[-2]
  system = next(s for s in demo_vision.SYSTEMS if s.replace(",", "_") == name)
  assert (c.image_search.enabled, c.memory.bank.text_image) == demo_vision.SYSTEMS[system]
  per_question = dict(zip(("q0", "q1"), F1[system]))
  f1 = sum(per_question.values()) / 2
  return {"full": {"em": f1, "f1": f1, "f1_per_question": per_question}}


def test_the_table_compares_the_tool_and_the_captions(tmp_path, capsys):
  c = demo_vision.get_config()
  with c.unlocked():
    c.workdir = str(tmp_path)
  result = vision_demo.run(c, one_seed=scripted)
  assert sorted(result["per_seed"]) == [0, 1, 2]
  assert result["per_seed"][1]["no_tool,no_text_image"]["f1"] == 0.25
  tool = result["comparisons"]["tool,text_image > no_tool,text_image"]
  assert tool["f1_higher_on"] == 3 and tool["questions"]["a_better"] == 6
  captions = result["comparisons"]["tool,text_image > tool,no_text_image"]
  assert captions["f1_higher_on"] == 3 and captions["questions"]["a_better"] == 3
  assert captions["questions"]["b_better"] == 0
  written = json.loads((tmp_path / "vision.json").read_text())
  assert written["comparisons"] == json.loads(json.dumps(result["comparisons"]))
  printed = capsys.readouterr().out
  assert "no_tool,no_text_image" in printed and "pooled questions: 6 better, 0 worse" in printed


def test_the_config_switches_the_tool_and_the_captions():
  c = demo_vision.get_config("no_tool,text_image")
  assert not c.image_search.enabled and c.memory.bank.text_image and not c.systems
  assert c.data.image_share == 1.0 and c.model.image_size == 112
  c = vision_demo.system_config(demo_vision.get_config(), "tool,no_text_image")
  assert c.image_search.enabled and not c.memory.bank.text_image and not c.systems
  assert c.workdir.endswith("demo_vision/tool_no_text_image")
  with pytest.raises(ValueError, match="'tool'"):
    demo_vision.get_config("tool")
  bad = demo_vision.get_config()
  with bad.unlocked():
    bad.systems["tool,text_image"]["tools"] = True  # a switch the systems do not have
  with pytest.raises(ValueError, match=r"config.systems\['tool,text_image'\]"):
    vision_demo.system_config(bad, "tool,text_image")


def test_each_seed_world_holds_out_32_questions_most_of_them_image_questions():
  from apex_jax import experiment
  from apex_jax.seeds import seed_config

  c = demo_vision.get_config("tool,text_image")
  for seed in c.seeds:
    _, test, _ = experiment.load_data(seed_config(c, seed))
    assert len(test) >= c.eval.questions == 32
    assert sum(bool(ex.images) for ex in test[:32]) >= 16
