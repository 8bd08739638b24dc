"""`launchers.generate --image=FILE` with a tiny Qwen2.5-VL folder the test writes: the printed
rows (the engine's, on one device) are `vl_sampling.sample`'s for the same prompts and images;
bad images refused by name."""

import os
import re
import struct
import subprocess
import sys
import zlib

import jax
import numpy as np
import pytest

from launchers import generate_lib
from apex_jax.tools import images as images_lib
from morse_jax import llm
from morse_jax.llm import vl, vl_sampling
from tests import test_configs


def png(path, height, width, seed=0):
  from PIL import Image

  rgb = np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)
  Image.fromarray(rgb).save(path)
  return str(path)


def huge_png_header(path, side=9000):
  """A PNG whose header claims side x side pixels (the decompression-bomb guard reads only it)."""
  def chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
  ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
  data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
  path.write_bytes(data + chunk(b"IEND", b""))
  return str(path)


def run_generate(*args):
  return subprocess.run([sys.executable, "-m", "launchers.generate", *args], cwd=test_configs.ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_generate_with_images_prints_the_vl_samplers_rows(vl_folder, tmp_path):
  folder, _ = vl_folder
  files = [png(tmp_path / "a.png", 300, 200, 0), png(tmp_path / "b.png", 50, 80, 1)]
  done = run_generate(f"--model={folder}", *[f"--image={f}" for f in files], "--prompt=x",
                      "--prompt=y", "--rows=1", "--max_new_tokens=4", "--temperature=0",
                      "--seed=0")
  assert done.returncode == 0, done.stderr[-3000:]
  printed = [list(map(int, m.split())) for m in
             re.findall(r"^\[\d\] \(4 tokens, mean log-prob [-\d.]+\) ([\d ]+)$", done.stdout,
                        re.M)]
  model = vl.load(folder)
  rng = np.random.RandomState(0)
  rows = [generate_lib.vl_prompt(model, p, 2, rng) for p in ("x", "y")]
  assert all(r.count(model.config.image_token_id) == 512 for r in rows)
  images = generate_lib.read_images(files)
  assert [i.shape for i in images] == [(3, 448, 448)] * 2
  settings = llm.GenerationSettings.for_model(model.text, 4, llm.GREEDY)
  want = vl_sampling.sample(model, rows, [images] * 2, settings, rng=jax.random.key(1))
  assert printed == want.tokens.tolist()


@pytest.mark.slow
def test_vl_sampler_on_one_device_is_the_engine(vl_folder, monkeypatch):
  """The rows the launcher prints come from `Engine.generate` with the images (the static
  sampler, made to fail here, is not called), equal to the static sampler's."""
  from morse_jax.llm import engine as engine_lib

  model = vl.load(vl_folder[0])
  images = [np.random.RandomState(0).randn(3, 448, 448).astype(np.float32)]
  rows = [generate_lib.vl_prompt(model, p, 1, np.random.RandomState(1)) for p in ("x", "y")]
  settings = llm.GenerationSettings.for_model(model.text, 3, llm.GREEDY)
  want = vl_sampling.sample(model, rows, [images] * 2, settings, rng=jax.random.key(0))
  calls = []
  real = engine_lib.Engine.generate
  monkeypatch.setattr(engine_lib.Engine, "generate",
                      lambda self, *a, **k: calls.append(k["images"]) or real(self, *a, **k))
  monkeypatch.setattr(vl_sampling, "sample", None)
  out = generate_lib.vl_sampler(model, rows, images, settings)(jax.random.key(0))
  np.testing.assert_array_equal(out.tokens, want.tokens)
  assert len(calls) == 1 and [len(i) for i in calls[0]] == [1, 1]


@pytest.mark.parametrize("case", ["undecodable", "not_vl"])
def test_generate_refuses_a_bad_image_or_a_text_model_by_name(vl_folder, tmp_path, case):
  bad = tmp_path / "bad.png"
  bad.write_bytes(b"not an image")
  model = [] if case == "not_vl" else [f"--model={vl_folder[0]}"]
  image = png(tmp_path / "ok.png", 28, 28) if case == "not_vl" else str(bad)
  done = run_generate(*model, f"--image={image}")
  assert done.returncode != 0
  want = "--image needs a Qwen2.5-VL --model" if case == "not_vl" else f"{bad}: not a readable"
  assert want in done.stderr


def test_read_images_refuses_missing_oversized_and_too_large_files(tmp_path, monkeypatch):
  with pytest.raises(images_lib.ImageError, match=re.escape(f"{tmp_path}/none.png: cannot be read")):
    generate_lib.read_images([str(tmp_path / "none.png")])
  huge = huge_png_header(tmp_path / "huge.png")
  with pytest.raises(images_lib.ImageError, match=re.escape(f"{huge}: 9000 x 9000 pixels")):
    generate_lib.read_images([huge])
  small = png(tmp_path / "small.png", 28, 28)
  monkeypatch.setattr(images_lib, "MAX_BYTES", 100)
  with pytest.raises(images_lib.ImageError, match=re.escape(f"{small}: ")):
    generate_lib.read_images([small])
