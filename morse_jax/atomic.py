"""Atomic file replacement (readers see the old file or the new one, never a torn one) and the
sha256 that checks a written file."""

from __future__ import annotations

import hashlib
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


def file_sha256(path: str) -> str:
  """The sha256 of a file's bytes, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()
