"""The committed MoRSE toy's second step: a small dose of `string_analysis` executor turns,
continuing from assets/toy_qwen3, the other categories replayed (docs/RESULTS.md):

  python -m launchers.pretrain_toy --config=configs/toy/qwen3_dose.py
"""

from configs.toy import common


def get_config(arg=None):
  del arg
  c = common.base("assets/toy_qwen3", steps=80, batch=8, lr=5e-4, warmup=5)
  c.init = "assets/toy_qwen3"
  c.data.update(problems=1000, categories=("string_analysis",), replay=1.0)
  return c
