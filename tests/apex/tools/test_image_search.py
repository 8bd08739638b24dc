"""The image-to-image search over a results cache in the authors' layout, and image decoding:
fixtures are tiny images the tests write."""

import base64
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from apex_jax.tools import images
from apex_jax.tools.image_search import FAILED, ImageSearch, ImageSearchError

pytest.importorskip("PIL")


def png(color, size=(20, 12), fmt="PNG") -> bytes:
  buffer = io.BytesIO()
  Image.new("RGB", size, color).save(buffer, fmt)
  return buffer.getvalue()


def entry(root, data_id, meta, files):
  folder = os.path.join(root, data_id)
  os.makedirs(folder)
  if meta is not None:
    with open(os.path.join(folder, "meta.json"), "w", encoding="utf-8") as f:
      f.write(meta if isinstance(meta, str) else json.dumps(meta))
  for name, data in files.items():
    with open(os.path.join(folder, name), "wb") as f:
      f.write(data)
  return folder


def test_search_results_layout_at_most_three(tmp_path):
  root = str(tmp_path)
  colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (9, 9, 9)]
  entry(root, "q1", {"search_results": [{"title": f"t{i} <image>", "image_url": "u"}
                                        for i in range(4)]},
        {"img_000.png": png(colors[0]), "img_001.jpg": png(colors[1], fmt="JPEG"),
         "img_002.webp": png(colors[2], fmt="WEBP"), "img_003.png": png(colors[3])})
  res = ImageSearch(root).search("q1")
  assert res.text == ("[Image Search Results]: \n1. title: t0 \n<image>\n"
                      "2. title: t1 \n<image>\n3. title: t2 \n<image>\n")
  assert res.titles == ("t0 ", "t1 ", "t2 ")
  assert [x.shape for x in res.images] == [(448, 448, 3)] * 3
  assert all(x.dtype == np.uint8 for x in res.images)
  np.testing.assert_array_equal(res.images[0][200, 200], [255, 0, 0])
  assert abs(int(res.images[1][200, 200, 1]) - 255) <= 3  # JPEG, near green
  assert len(ImageSearch(root, max_results=1).search("q1").images) == 1


def test_title_list_layout_and_html_pages_skipped(tmp_path):
  root = str(tmp_path)
  entry(root, "q2", {"title_list": ["a", "b", "c"], "image_urls": ["u0", "u1"]},
        {"img_000.html": b"<html>", "img_001.gif": png((1, 2, 3), fmt="GIF")})
  res = ImageSearch(root).search("q2")
  assert res.titles == ("b",)  # "c" has no url (zip), "a" was a web page
  assert res.text.count(images.MARKER) == len(res.images) == 1


@pytest.mark.parametrize("data_id, meta, files, match", [
    ("absent", None, None, "no cached results for id 'absent'"),
    ("q", None, {}, r"meta.json: missing"),
    ("q", "{not json", {}, r"meta.json: unreadable \(JSONDecodeError"),
    ("q", "[1, 2]", {}, "expected a JSON object, got list"),
    ("q", {"other": 1}, {}, "has neither 'search_results' nor 'title_list'"),
    ("q", {"search_results": [{"title": "t"}]}, {}, r"result 0 has no img_000\{.jpg"),
    ("q", {"search_results": [{"title": "t"}]}, {"img_000.png": b"\x89PNG broken"},
     r"img_000.png: not a readable image"),
    ("q", {"search_results": [{"title": 3}]}, {}, "a title is not a string: 3"),
])
def test_damaged_entries_are_clear_errors(tmp_path, data_id, meta, files, match):
  root = str(tmp_path)
  if files is not None:
    entry(root, "q", meta, files)
  with pytest.raises(ImageSearchError, match=match):
    ImageSearch(root).search(data_id)


@pytest.mark.parametrize("data_id", ["", "../x", "a/b", None, ".."])
def test_bad_ids_and_roots_refused_by_name(tmp_path, data_id):
  with pytest.raises(ValueError, match="data_id"):
    ImageSearch(str(tmp_path)).search(data_id)
  with pytest.raises(ValueError, match="root '/no/such' is not a folder"):
    ImageSearch("/no/such")
  with pytest.raises(ValueError, match="max_results must be an integer >= 1, got 0"):
    ImageSearch(str(tmp_path), max_results=0)
  assert FAILED.startswith("[Image Search Results] There is an error")


def test_decode_base64_and_data_urls():
  data = png((10, 20, 30))
  b64 = base64.b64encode(data).decode()
  for text in (b64, "data:image/png;base64," + b64, "data:image;base64," + b64):
    np.testing.assert_array_equal(images.decode_base64(text, "row 3 images[0]")[0, 0],
                                  [10, 20, 30])
  round_trip = images.decode_base64(images.to_data_url(images.decode(data, "x")), "y")
  assert round_trip.shape == (448, 448, 3)


@pytest.mark.parametrize("text, match", [
    ("http://example.com/a.png", "is a URL; only data URLs"),
    ("data:text/plain;base64,aGk=", "is not a base64 image data URL"),
    ("data:image/png,abc", "is not a base64 image data URL"),
    ("!!!not base64", "not valid base64"),
    (base64.b64encode(b"just text").decode(), "not a readable image"),
    ("", "expected base64 text or a data URL"),
])
def test_bad_images_refused_naming_the_field(text, match):
  with pytest.raises(images.ImageError, match=f"row 3 images\\[0\\]: .*{match}"):
    images.decode_base64(text, "row 3 images[0]")


def test_oversized_and_wrong_arrays_refused(monkeypatch):
  monkeypatch.setattr(images, "MAX_BYTES", 10)
  with pytest.raises(images.ImageError, match=r"f.png: \d+ bytes, more than the 10 allowed"):
    images.decode(png((0, 0, 0)), "f.png")
  with pytest.raises(images.ImageError, match=r"img: expected a uint8 array \[448, 448, 3\]"):
    images.check_array(np.zeros((448, 448), np.uint8), "img")
