"""The executor's `web_image_to_image_search`: a lookup in a pre-cached results folder, as the
authors' tool (Executor-Train/Train/verl/tools/web_image_to_image_search_tool.py; the inference
copy is Serve/Train_Planner/tool_image.py):

  <root>/<id>/meta.json   {"search_results": [{"title": ..., "image_url": ...}, ...]}
                          or {"title_list": [...], "image_urls": [...]}
  <root>/<id>/img_000.jpg|png|webp|gif, img_001.*, ...   (img_NNN.html: a page, skipped)

At most `max_results` (3) results, each its title and one `<image>` marker in the text, its
image decoded to 448 x 448 RGB (`images.decode`). Where the authors substitute a grey picture
for a missing or unreadable file, here a missing id folder, a missing or damaged meta.json and
an image that is absent or undecodable raise `ImageSearchError` naming the path: the executor
counts it and shows the model the authors' error text.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from apex_jax.tools import images

NAME = "web_image_to_image_search"
EXTENSIONS = (".jpg", ".png", ".webp", ".gif")
HEADER = "[Image Search Results]: \n"
# the authors' tool output when the search fails (call_image_search's except branch)
FAILED = ("[Image Search Results] There is an error encountered in performing search. Please "
          "reason with your own capabilities.")


class ImageSearchError(RuntimeError):
  """A cache entry the tool cannot answer from; the message names the path and the fault."""


@dataclasses.dataclass(frozen=True)
class ImageResults:
  text: str  # HEADER, then "k. title: ...\n<image>\n" per result
  images: tuple[np.ndarray, ...]  # uint8 [448, 448, 3], in the order of the text's markers
  titles: tuple[str, ...]


def check_id(data_id) -> str:
  """A question id usable as one folder name under the cache root."""
  if not isinstance(data_id, str) or not data_id.strip():
    raise ValueError(f"image search: data_id must be a non-empty string, got {data_id!r}")
  if data_id in (".", "..") or "/" in data_id or "\\" in data_id or "\0" in data_id:
    raise ValueError(f"image search: data_id {data_id!r} is not a plain folder name")
  return data_id


class ImageSearch:
  """`search(data_id) -> ImageResults` over a cache root in the authors' layout."""

  def __init__(self, root: str, max_results: int = 3, size: int = images.IMAGE_SIZE):
    if not isinstance(root, str) or not os.path.isdir(root):
      raise ValueError(f"image search: root {root!r} is not a folder")
    if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
      raise ValueError(f"image search: max_results must be an integer >= 1, got {max_results!r}")
    self.root, self.max_results, self.size = root, max_results, size

  def search(self, data_id: str) -> ImageResults:
    folder = os.path.join(self.root, check_id(data_id))
    if not os.path.isdir(folder):
      raise ImageSearchError(f"{folder}: no cached results for id {data_id!r}")
    titles = _titles(os.path.join(folder, "meta.json"))
    found, kept = [], []
    for i, title in enumerate(titles):
      if len(found) == self.max_results:
        break
      if os.path.exists(os.path.join(folder, f"img_{i:03d}.html")):
        continue  # the authors skip a result whose image was a web page
      try:
        found.append(images.read(_image_path(folder, i), self.size))
      except images.ImageError as e:
        raise ImageSearchError(str(e)) from None
      kept.append(title)
    return ImageResults(results_text(kept), tuple(found), tuple(kept))


def results_text(titles) -> str:
  """The tool's text for results of these titles: HEADER, then "k. title: ...", one image
  marker each (the toy's drills write the same text: apex_jax.toy.vision_drills)."""
  return HEADER + "".join(f"{k}. title: {t}\n{images.MARKER}\n"
                          for k, t in enumerate(titles, 1))


def _titles(meta_path: str) -> list[str]:
  """The result titles of meta.json, in order (one per image_url), `<image>` removed."""
  try:
    with open(meta_path, encoding="utf-8") as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise ImageSearchError(f"{meta_path}: missing") from None
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ImageSearchError(f"{meta_path}: unreadable ({type(e).__name__}: {e})") from None
  if not isinstance(meta, dict):
    raise ImageSearchError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
  if "search_results" in meta:
    results = meta["search_results"]
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
      raise ImageSearchError(f"{meta_path}: 'search_results' must be a list of objects")
    titles = [r.get("title", "") for r in results]
  elif "title_list" in meta and "image_urls" in meta:
    titles, urls = meta["title_list"], meta["image_urls"]
    if not isinstance(titles, list) or not isinstance(urls, list):
      raise ImageSearchError(f"{meta_path}: 'title_list' and 'image_urls' must be lists")
    titles = titles[:len(urls)]  # the authors zip the two
  else:
    raise ImageSearchError(f"{meta_path}: has neither 'search_results' nor 'title_list' with "
                           f"'image_urls'")
  bad = [t for t in titles if not isinstance(t, str)]
  if bad:
    raise ImageSearchError(f"{meta_path}: a title is not a string: {bad[0]!r:.60}")
  return [t.replace(images.MARKER, "") for t in titles]


def _image_path(folder: str, i: int) -> str:
  for ext in EXTENSIONS:
    path = os.path.join(folder, f"img_{i:03d}{ext}")
    if os.path.exists(path):
      return path
  raise ImageSearchError(f"{folder}: result {i} has no img_{i:03d}{{{','.join(EXTENSIONS)}}}")
