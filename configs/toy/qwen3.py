"""The committed MoRSE toy (assets/toy_qwen3), from scratch (docs/RESULTS.md; on an H200):

  python -m launchers.pretrain_toy --config=configs/toy/qwen3.py
  python -m launchers.pretrain_toy --config=configs/toy/qwen3.py --config.toy.steps=30 \
      --config.data.problems=200 --config.out=/tmp/toy_try          # a quick look
"""

from configs.toy import common


def get_config(arg=None):
  del arg
  c = common.base("assets/toy_qwen3", steps=3000, batch=16, lr=1e-3)
  c.data.problems = 3000
  return c
