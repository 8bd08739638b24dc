"""MoRSE on humaneval: `get_config("variant,backbone,hardware")`, see configs/morse/common.py."""

from configs.morse import common


def get_config(arg=None):
  return common.apply(common.base(), arg, "humaneval")
