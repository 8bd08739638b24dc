"""Atomic file replacement: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, TypeVar

T = TypeVar("T")


def replace_with(path: str, fill: Callable[[str], T], prefix: str = ".tmp.") -> T:
  """Calls `fill(tmp)` on a temporary path in `path`'s folder, fsyncs what it wrote, then
  renames it over `path`; on any failure the temporary file is removed and `path` is
  untouched. Returns what `fill` returned."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
  os.close(fd)
  try:
    out = fill(tmp)
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
    return out
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str, prefix: str = ".tmp.") -> None:
  """`text` written to `path` atomically (`replace_with`)."""
  def fill(tmp):
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
  replace_with(path, fill, prefix)
