"""configs/apex/paper.py: the paper's numbers, an empty path refused by name, and the whole
config built (experiment.build, no training) on a tiny Hugging Face model, a small world folder
and a search index over it."""

import pytest

from apex_jax import experiment, pipeline
from apex_jax.datasets import World
from apex_jax.training.stages import STAGE_ORDER
from configs.apex import demo_cpu, paper
from morse_jax.config_sections import settings
from tests import tiny_models


def test_paper_numbers_and_overrides():
  c = paper.get_config()  # builds with no paths at all
  assert (c.ttrl.batch_size, c.ttrl.group_size, c.ttrl.learning_rate) == (8, 4, 2e-7)
  assert c.ttrl.agents.max_tool_tokens == 8192 and c.ttrl.summarize
  s = c.stages
  assert [(s[m].batch_size, s[m].group_size, s[m].learning_rate) for m in STAGE_ORDER] == [
      (128, 8, 1e-6), (64, 8, 1e-6), (48, 4, 1e-6)]  # planner: Table 6's G 4 (script: 8)
  assert s.executor.agents.max_tool_tokens == 4096 and s.planner.agents.max_tool_tokens == 8192
  assert [s[m].agents.max_context_tokens for m in STAGE_ORDER] == [32768, 6144, 32768]
  assert [s[m].max_new_tokens for m in STAGE_ORDER] == [16384, 2048, 8192]
  assert (c.agents.max_turns, c.agents.max_llm_calls, c.search.topk) == (10, 20, 3)
  assert c.judges.max_tokens == 1000 and c.judges.kind == "inprocess"
  assert (c.judges.accuracy, c.judges.rule, c.judges.skill_quality) == ("judge", "em", "judge")
  http = paper.get_config("model=/m,judge=http://h:8002/v1")
  assert (http.judges.kind, http.judges.url, http.judges.path) == ("http", "http://h:8002/v1", "")
  assert paper.get_config("/just/a/model").model.path == "/just/a/model"
  with pytest.raises(ValueError, match="unknown key 'modle'"):
    paper.get_config("modle=/m")


def test_the_step_takes_the_papers_loss_and_advantages_or_ours():
  from morse_jax.rl.advantages import MIN_REWARD_STD

  step_config = lambda c: experiment.train_config(c).step
  ours, theirs = (step_config(m.get_config()) for m in (demo_cpu, paper))
  assert (ours.aggregation, ours.advantage_clip, ours.min_reward_std) == (
      "token-mean", 5.0, MIN_REWARD_STD)
  assert (theirs.aggregation, theirs.advantage_clip, theirs.min_reward_std) == (
      "seq-mean-token-mean", 0.0, 0.0)  # advantage_clip 0: no clip
  old = demo_cpu.get_config()
  for key in ("aggregation", "advantage_clip", "min_reward_std"):
    del old.train.step[key]  # a config written before the switches: ours
  assert step_config(old) == ours
  bad = demo_cpu.get_config()
  bad.train.step.aggregation = "sum"
  with pytest.raises(ValueError, match=r"config.train.step: StepConfig.aggregation 'sum' not in"):
    step_config(bad)
  bad = demo_cpu.get_config()
  bad.train.step.advantage_clip = -1.0
  with pytest.raises(ValueError, match=r"StepConfig.advantage_clip must be >= 0, got -1.0"):
    step_config(bad)


@pytest.mark.parametrize("arg, field", [
    ("", "config.model.path"),
    ("model=/m", "config.judges.path"),
    ("model=/m,judge=http://h/v1", "config.data.folder"),
    ("model=/m,judge=http://h/v1,data=/d", "config.search.index"),
])
def test_empty_paths_refused_by_name(arg, field):
  with pytest.raises(ValueError, match=f"{field} is empty"):
    experiment.build(paper.get_config(arg))


def test_missing_judge_folder_refused():
  c = paper.get_config("model=/m,judge=/no/such/judge,data=/d,index=/i")
  with pytest.raises(ValueError, match="config.judges.path '/no/such/judge' does not exist"):
    experiment.build(c)


def test_epochs_become_steps():
  def phases(c):
    return (settings(experiment.StagePhase, c.stages.executor, "stages.executor",
                     module="executor"), settings(experiment.TtrlPhase, c.ttrl, "ttrl"))

  executor, ttrl = phases(paper.get_config())
  assert executor.steps_over(1000) == 63  # ceil(8 * 1000 / 128)
  assert ttrl.steps_over(20) == 3  # ceil(20 / 8)
  assert ttrl.ttrl(20).learning_rate == 2e-7
  demo = demo_cpu.get_config()
  assert phases(demo)[0].steps_over(1000) == demo.stages.executor.steps


def test_builds_on_a_tiny_model(tmp_path):
  from apex_jax.tools import index

  # 8 layers: the config adapts the last 8 (tiny otherwise: hidden 32)
  model, _ = tiny_models.save_hf_model("qwen3", str(tmp_path / "model"), num_hidden_layers=8)
  data = str(tmp_path / "world")
  World.generate(3, 30, 16).write(data, test_fraction=0.25)
  idx = str(tmp_path / "index")
  index.build_index(f"{data}/corpus.jsonl", idx, index.SentenceEncoder(), batch_size=64,
                    log=lambda _: None)
  c = paper.get_config(f"model={model},judge={model},data={data},index={idx}")
  c.workdir = str(tmp_path / "run")
  c.model.dtype = c.judges.dtype = "float32"
  exp = experiment.build(c)
  assert exp.agents.max_tool_tokens == 4096 and exp.agents.prompts == "authors"
  assert len(exp.train) == 12 and len(exp.test) == 4
  assert exp.searcher.search(["who"])[0]  # the index answers
  # the executor stage reads the paper's tool length, TTRL its own; the distiller stage needs
  # memories first (memory_build), so only the two question stages are built here
  c.stages.distiller.epochs = 0
  built = pipeline.stages(exp)
  assert [(s.config.module, s.config.steps, s.config.batch_size) for s in built] == [
      ("executor", 1, 128), ("planner", 2, 48)]  # ceil(8 * 12 / 128), ceil(5 * 12 / 48)
  assert [s.rollout_fn.agent_config.max_tool_tokens for s in built] == [4096, 8192]
  ttrl = settings(experiment.TtrlPhase, c.ttrl, "ttrl")
  assert experiment.agents_for(exp, ttrl).max_context_tokens == 24576 + 8192
  exp.bank.close()


def test_hotpotqa_data_through_the_array_record_source(tmp_path):
  import shutil

  from apex_jax.datasets import hotpotqa
  from morse_jax import llm
  from tests.apex.agents import fakes
  from tests.apex.datasets.test_loaders import HOTPOT_DEV
  from tests.apex.memory.fakes import HashEmbedder
  from tests.apex.training.conftest import CONFIG, Tiny

  folder = tmp_path / "hotpot"
  folder.mkdir()
  for name in ("hotpot_train_v1.1.json", "hotpot_dev_distractor_v1.json"):
    shutil.copy(HOTPOT_DEV, folder / name)
  c = paper.get_config(f"model=/m,judge=http://h/v1,data=hotpotqa:{folder}")
  assert (c.data.source, c.data.folder, c.data.test_split) == ("hotpotqa", str(folder),
                                                                "dev_distractor")
  c.workdir, c.data.cache_dir = str(tmp_path / "run"), str(tmp_path / "cache")
  c.search.kind = "ngram"  # in process, over the questions' own paragraphs
  c.lora.last_n_layers = 2
  model = llm.Model(CONFIG, Tiny().backbone, fakes.tokenizer(), stop_ids=(fakes.EOS,))
  exp = experiment.build(c, model=model, generator=fakes.ScriptedGenerator(lambda *a: ""),
                         embedder=HashEmbedder(64))
  expected = hotpotqa.load(HOTPOT_DEV)
  assert list(exp.train) == expected and exp.test[1] == expected[1]
  assert exp.train[:2] == expected[:2]  # memory_build's slice
  assert exp.searcher.search([expected[0].question])[0]
  exp.bank.close()
