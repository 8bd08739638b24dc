"""The APEx demo that sees (issue 56 item 5): the vision toy (assets/toy_apex_vision: the text
toy behind a Qwen2.5-VL tower, apex_jax.toy.vision_train) on worlds whose chain questions ask
about "the <kind> in the image", with and without the image-search tool and with and without
text-image memories, three seeds (worlds 777, 778, 779).

  python -m launchers.train --config=configs/apex/demo_vision.py    # make demo-apex-vision
  python -m launchers.train --config=configs/apex/demo_vision.py:tool,no_text_image  # one system

No arg: the four systems one after the other in one process (`apex_jax.vision_demo`), then their
table. A system is memory building on the world's training questions (its own bank: captions in
it or not; its episodes with or without the tool) and the held-out evaluation of the initial
experts with that bank (the `full` row): the toy is not trained by RL here, so the rows measure
what the tool and the captions give the agents as they are. Everything else is
configs/apex/demo_cpu.py's.
"""

import os

from configs.apex import demo_cpu

# system -> (image-search tool offered, captions in the bank)
SYSTEMS = {"tool,text_image": (True, True), "tool,no_text_image": (True, False),
           "no_tool,text_image": (False, True), "no_tool,no_text_image": (False, False)}


def get_config(arg=None):
  if arg is not None and arg not in SYSTEMS:
    raise ValueError(f"configs/apex/demo_vision.py: {arg!r} is not one of {tuple(SYSTEMS)}")
  c = demo_cpu.get_config(os.path.join(demo_cpu.ROOT, "assets", "toy_apex_vision"))
  c.workdir = "/tmp/apex_runs/demo_vision" + ("" if arg is None else "/" + arg.replace(",", "_"))
  c.model.image_size = 112  # the toy's bucket: 16 language-model tokens an image
  # every chain question an image question (the others stay text): 128 questions, 32 held out
  c.data.update(image_share=1.0, questions=128)
  c.image_search.enabled, c.memory.bank.text_image = SYSTEMS[arg or "tool,text_image"]
  # apex_jax.vision_demo: name -> {"image_search": bool, "text_image": bool}; {}: one system
  c.systems = {} if arg is not None else {
      name: dict(image_search=tool, text_image=captions)
      for name, (tool, captions) in SYSTEMS.items()}
  # greedy, as the procedure demo's; in two batches of 12 and the evaluation in one of 32 (fewer
  # sampler calls: the 12 runs of the demo fit 20 minutes)
  # workflow summaries by rule (the runs' searches and answer), as the procedure demo's: the
  # toy's Distiller was never shown an image run, and its summaries of them copied the image
  # search's call into the first step ("search(\" Peb_call>4. search(...")
  c.agents.summaries = "rule"
  c.memory_build.update(questions=24, batch_size=12, temperature=0.0)
  for stage in c.stages.values():
    stage.steps = 0
  c.ttrl.steps = 0
  c.eval.update(questions=32, batch_size=32, ablations=("full",), untrained=False)
  c.seeds = (0, 1, 2)
  c.seed_worlds = True
  return c
