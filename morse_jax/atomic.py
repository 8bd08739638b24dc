"""Atomic file replacement: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import os
import tempfile


def write_text(path: str, text: str, prefix: str = ".tmp.") -> None:
  """Writes `text` to a temporary file in the same folder, fsyncs it, then renames it over
  `path`; on any failure the temporary file is removed and `path` is untouched."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
