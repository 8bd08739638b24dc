"""Images as the APEx executor sees them: decoded with Pillow, RGB, resized to 448 x 448 (the
authors resize the question's image and every image-search result so, Executor-Train/Train/
local_search/mmsearch.py and verl/tools/web_image_to_image_search_tool.py, LANCZOS for the
results), kept as uint8 arrays [448, 448, 3]: 1024 patches of 14 px, 256 tokens after the
2 x 2 merger, one static shape for the vision tower.

Bad bytes never crash a run: every failure is an `ImageError` naming what was read.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

IMAGE_SIZE = 448
MARKER = "<image>"  # one per image in a message's text, in the order of its images
MAX_BYTES = 32 * 1024 * 1024  # an encoded image larger than this is refused, not decoded
MAX_PIXELS = 64 * 1024 * 1024  # Pillow's decompression-bomb guard, explicit here


class ImageError(ValueError):
  """Bytes that are not an image this project reads; the message names their source."""


def strip_markers(text: str) -> str:
  """Text with its `<image>` markers removed: text from data or a search that must not claim an
  image slot (the authors strip them from plans and result titles)."""
  return text.replace(MARKER, "")


def decode(data: bytes, what: str, size: int = IMAGE_SIZE) -> np.ndarray:
  """Encoded image bytes (JPEG, PNG, WebP, GIF: the first frame) -> uint8 [size, size, 3]."""
  from PIL import Image  # Pillow: imported where images are read, not by the text paths

  if not isinstance(data, (bytes, bytearray)):
    raise ImageError(f"{what}: expected image bytes, got {type(data).__name__}")
  if not data:
    raise ImageError(f"{what}: empty (0 bytes)")
  if len(data) > MAX_BYTES:
    raise ImageError(f"{what}: {len(data)} bytes, more than the {MAX_BYTES} allowed")
  try:
    with Image.open(io.BytesIO(data)) as img:
      width, height = img.size
      if width * height > MAX_PIXELS:
        raise ImageError(f"{what}: {width} x {height} pixels, more than {MAX_PIXELS}")
      img.load()
      rgb = img.convert("RGB").resize((size, size), Image.LANCZOS)
  except ImageError:
    raise
  except Exception as e:  # noqa: BLE001 -- Pillow raises many kinds for damaged bytes
    raise ImageError(f"{what}: not a readable image ({type(e).__name__}: {e})") from None
  return np.asarray(rgb, np.uint8)


def read(path: str, size: int = IMAGE_SIZE) -> np.ndarray:
  """An image file -> uint8 [size, size, 3]; ImageError naming the path when unreadable."""
  try:
    with open(path, "rb") as f:
      data = f.read(MAX_BYTES + 1)
  except OSError as e:
    raise ImageError(f"{path}: cannot be read ({e.strerror or e})") from None
  return decode(data, path, size)


def decode_base64(text: str, what: str, size: int = IMAGE_SIZE) -> np.ndarray:
  """A data URL (`data:image/png;base64,...`, or the authors' `data:image;base64,...`) or bare
  base64 text -> uint8 [size, size, 3]. Other URLs are refused: nothing is fetched."""
  if not isinstance(text, str) or not text.strip():
    raise ImageError(f"{what}: expected base64 text or a data URL, got {text!r:.60}")
  text = text.strip()
  if text.startswith("data:"):
    head, sep, text = text.partition(",")
    if not sep or not head.endswith(";base64") or not head[5:].startswith("image"):
      raise ImageError(f"{what}: {head[:40]!r} is not a base64 image data URL")
  elif "://" in text[:16]:
    raise ImageError(f"{what}: {text[:40]!r} is a URL; only data URLs are read (no fetching)")
  if len(text) > MAX_BYTES * 4 // 3 + 4:
    raise ImageError(f"{what}: {len(text)} base64 characters, more than {MAX_BYTES} bytes")
  try:
    data = base64.b64decode(text, validate=True)
  except (binascii.Error, ValueError) as e:
    raise ImageError(f"{what}: not valid base64 ({e})") from None
  return decode(data, what, size)


def check_array(image, what: str, size: int = IMAGE_SIZE) -> np.ndarray:
  """An already decoded image: uint8 [size, size, 3] or refused naming `what`."""
  array = np.asarray(image)
  if array.dtype != np.uint8 or array.shape != (size, size, 3):
    raise ImageError(f"{what}: expected a uint8 array [{size}, {size}, 3], got {array.dtype} "
                     f"{list(array.shape)}")
  return array


def resized(image: np.ndarray, size: int) -> np.ndarray:
  """uint8 [h, w, 3] -> uint8 [size, size, 3] (Lanczos, as `decode` resizes; unchanged when it
  is that size already): a backbone's smaller size bucket."""
  from PIL import Image

  array = np.asarray(image)
  if array.shape[:2] == (size, size):
    return array
  return np.asarray(Image.fromarray(array).resize((size, size), Image.LANCZOS), np.uint8)


def encode_png(image: np.ndarray) -> bytes:
  """uint8 [h, h, 3] -> PNG bytes (an image-search cache's img_NNN.png)."""
  from PIL import Image

  buffer = io.BytesIO()
  Image.fromarray(check_array(image, "image", np.asarray(image).shape[0])).save(buffer, "PNG")
  return buffer.getvalue()


def to_data_url(image: np.ndarray) -> str:
  """uint8 [h, w, 3] -> `data:image/png;base64,...` (an OpenAI chat `image_url`)."""
  return "data:image/png;base64," + base64.b64encode(encode_png(image)).decode("ascii")
