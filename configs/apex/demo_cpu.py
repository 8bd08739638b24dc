"""A CPU-sized APEx run: a small synthetic world, a tiny backbone, one or two updates per stage.

  config = demo_cpu.get_config("/path/to/model")      # or set config.model.path
  apex_jax.experiment.run(config)                     # results in <workdir>/results.json

The model is a local Hugging Face folder: a tiny model of the user's, or the committed toy
(assets/toy_qwen3, the default). Sizes are small so every piece runs in minutes; the numbers
mean nothing until the backbone can follow the agents' formats.
"""

import os

import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stage(steps, lr, max_new_tokens):
  return dict(steps=steps, batch_size=2, group_size=2, learning_rate=lr, temperature=1.0,
              max_new_tokens=max_new_tokens)


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.system = "apex"  # launchers.train dispatches on it (-> apex_jax.experiment.run)
  c.seed = 0
  c.workdir = "/tmp/apex_runs/demo_cpu"
  c.model = dict(path=arg or os.path.join(ROOT, "assets", "toy_qwen3"), dtype="float32")
  # "world": generated in memory; "folder": train/test/corpus.jsonl as World.write writes them
  c.data = dict(source="world", folder="", world_seed=7, entities=40, questions=24,
                test_fraction=0.25)
  c.search = dict(kind="word", index="", topk=3)  # "index": LocalSearch over a built index
  c.memory = dict(embedder="backbone_mean", embedder_path="", path="",  # path "": workdir
                  bank=dict(k=2, k_replan=1, evolve_every=4, evolve_min_size=2,
                            evolve_window=8))
  c.lora = dict(targets=("q", "v", "o"), last_n_layers=2, rank=4, alpha=8.0)
  c.train = dict(kl_coef=0.0, micro_batches=1)
  c.agents = dict(max_turns=3, max_llm_calls=6, max_tool_tokens=128, max_context_tokens=4096,
                  topk=3, planner_max_new_tokens=64, executor_max_new_tokens=64,
                  distiller_max_new_tokens=128, temperature=1.0, top_p=1.0,
                  prompts="compact", replan_memories=True)
  c.memory_build = dict(questions=8, batch_size=4, force_evolve=True)
  c.stages = dict(executor=_stage(1, 1e-4, 64), distiller=_stage(1, 1e-4, 128),
                  planner=_stage(1, 1e-4, 64))
  c.ttrl = dict(steps=1, batch_size=2, group_size=2, learning_rate=1e-5, temperature=1.0,
                max_new_tokens=64, summarize=False)
  c.judges = dict(kind="inprocess", url="", model="", max_tokens=32)
  c.eval = dict(questions=6, batch_size=6, temperature=0.0)
  return ml_collections.ConfigDict(c)
