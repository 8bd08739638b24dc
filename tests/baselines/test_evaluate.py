"""The baselines end to end on HumanEval with a scripted backbone (right code for one problem,
wrong for the other): the docstring examples they test on, the verifier's score in the same
records and summary as `single`, and `pipeline.evaluate` with a baseline variant."""

import json

import pytest

from configs.morse import common
from morse_jax.baselines import run as baselines
from morse_jax.experiments import evaluation, pipeline, records
from morse_jax.tasks import humaneval
from tests import test_configs
from tests.baselines.scripted import Scripted

PROBLEMS = humaneval.load()[:2]
FAMILY = humaneval.HumanEval()
RIGHT = {p.id: f"```python\n{p.data['prompt']}{p.data['canonical_solution']}```" for p in PROBLEMS}
WRONG = "```python\ndef separate_paren_groups(paren_string):\n    return []\n```"
VERDICTS = {"DemandAnalysis": "<INFO> as the docstring says",
            "CodeReviewComment": "<INFO> Finished", "critique": "<INFO> Finished",
            "TestErrorSummary": "It returns nothing.",
            "ensemble": "<solution_letter>A</solution_letter>"}


def respond(ask):
  """Right code for HumanEval/0, wrong code for HumanEval/1, whatever the phase asks."""
  if ask.phase in VERDICTS:
    return VERDICTS[ask.phase]
  text = " ".join(m["content"] for m in ask.messages)
  return RIGHT["HumanEval/0"] if "has_close_elements" in text else WRONG


def test_visible_tests_are_the_docstring_examples():
  assert humaneval.visible_tests(PROBLEMS[0]) == [
      "assert has_close_elements([1.0, 2.0, 3.0], 0.5) == False",
      "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True"]
  arrow = humaneval.load()[85]  # "add([4, 2, 6, 7]) ==> 2"
  assert humaneval.visible_tests(arrow) == ["assert add([4, 2, 6, 7]) == 2"]


def test_run_visible_passes_the_canonical_solution_and_reports_a_wrong_one():
  assert FAMILY.run_visible(PROBLEMS[0], RIGHT["HumanEval/0"]) == (True, "2 of 2 examples pass")
  passed, report = FAMILY.run_visible(PROBLEMS[1], WRONG)
  assert not passed and "separate_paren_groups" in report


@pytest.mark.parametrize("system", baselines.SYSTEMS)
def test_the_verifier_score_flows_into_the_records_of_single(system):
  chat = Scripted(respond)
  outcomes = baselines.run(system, chat, FAMILY, PROBLEMS, keep_prompts=True)
  # both tasks' first calls in one round; every call recorded on its task
  assert chat.rounds[0] == 2 * {"chatchain": 1, "macnet": 1, "aflow": 3}[system]
  lines = list(records.records(outcomes, prompts=True))
  assert lines[0]["prompt"].startswith(f"## {chat.asks[0].phase}\n")  # every call's messages
  assert lines[0]["prompt"].count("\n## ") == lines[0]["details"]["calls"] - 1
  assert sum(r["details"]["calls"] for r in lines if r["kind"] == "node") == len(chat.asks)
  assert [(r["kind"], r["problem_id"], r["passed"]) for r in lines] == [
      ("node", "HumanEval/0", True), ("problem", "HumanEval/0", True),
      ("node", "HumanEval/1", False), ("problem", "HumanEval/1", False)]
  right, wrong = lines[0], lines[2]
  assert right["reward"] == 1.0 and right["reason"] is None and wrong["reason"]
  assert right["details"]["calls"] == len(right["details"]["phases"]) >= 2
  assert right["prompt_tokens"] > 0 and right["generated_tokens"] > 0 and right["route"] == []
  summary = evaluation.summarize(outcomes)
  assert summary["problem_pass"] == summary["family/pass@1"] == 0.5


def test_evaluate_runs_a_baseline_variant(tmp_path, monkeypatch):
  folder = test_configs.tiny_models.save_hf_model("qwen3", str(tmp_path / "model"))[0]
  config = common.apply(common.base(), "chatchain,qwen3_4b,cpu", "humaneval")
  config.model.path, config.model.dtype = folder, "float32"
  config.task.limit, config.workdir, config.compilation_cache = 2, str(tmp_path / "run"), ""
  chats = []
  monkeypatch.setattr(pipeline.baselines, "backbone",
                      lambda agents, engine: chats.append(Scripted(respond)) or chats[-1])
  summary = pipeline.evaluate(config, split="all")
  assert summary["tasks"] == 2 and summary["problem_pass"] == 0.5
  lines = [json.loads(line) for line in open(summary["records"])]
  assert [(r["kind"], r["passed"]) for r in lines] == [("node", True), ("problem", True),
                                                       ("node", False), ("problem", False)]
  assert lines[2]["details"]["phases"][-1] == "TestModification"  # the test loop ran


@pytest.mark.slow  # ~15-25 s each: a tiny random model answers every call of the system
@pytest.mark.parametrize("system,calls", [("chatchain", 19), ("macnet", 10), ("aflow", 8)])
def test_a_random_model_never_crashes_a_baseline(tmp_path, system, calls):
  """Noise for every reply: each phase falls back, counted, and the run ends with records. The
  calls are each system's most (ChatChain, AFlow) or, for MacNet's seed-0 draw (the 4-agent
  mesh), its calls when no source writes code (no critique of empty code)."""
  folder = test_configs.tiny_models.save_hf_model(
      "qwen3", str(tmp_path / "model"), max_position_embeddings=4096)[0]
  config = common.apply(common.base(), f"{system},qwen3_4b,cpu", "humaneval")
  config.model.path, config.model.dtype = folder, "float32"
  config.task.limit, config.eval.max_new_tokens = 1, 4
  config.workdir, config.compilation_cache = str(tmp_path / "run"), ""
  summary = pipeline.evaluate(config, split="all")
  [node, _] = [json.loads(line) for line in open(summary["records"])]
  assert summary["problem_pass"] == 0.0 and node["details"]["calls"] == calls
  assert sum(node["details"]["fallbacks"].values()) >= 3 and node["cut"]
