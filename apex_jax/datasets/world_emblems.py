"""An emblem per entity of the synthetic world: a coloured shape with a row of marks on a
plain field, rendered with Pillow at the executor's 448 x 448, and a caption that describes it
without naming the entity ("a red triangle emblem with three white dots on a grey field").

Each entity of a world gets its own combination of shape, colour, marks, their count and field
(drawn without repeats from `random.Random(f"emblems:{seed}")`, so the text world's draws are
untouched; up to 256 entities no two share shape, colour and field), so no two entities share an
emblem or a caption. `render(emblem, variant)` gives the
canonical image (variant 0: the question's) or a copy slightly turned, scaled, moved and tinted
(variant > 0: an image-search result), the same for the same arguments.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Iterable

import numpy as np

from apex_jax.datasets.records import DatasetError
from apex_jax.tools.images import IMAGE_SIZE

SHAPES = ("circle", "square", "triangle", "diamond", "pentagon", "hexagon", "star", "cross")
COLOURS = {"red": (205, 35, 35), "orange": (240, 135, 20), "yellow": (230, 205, 25),
           "green": (40, 150, 55), "blue": (35, 75, 205), "purple": (125, 45, 165),
           "brown": (125, 75, 35), "black": (25, 25, 25)}
MARKS = ("dots", "bars", "rings")
COUNTS = (1, 2, 3, 4)
FIELDS = {"white": (248, 248, 248), "grey": (175, 175, 175), "pale blue": (195, 220, 248),
          "pale green": (200, 238, 200)}
_LIGHT = ("orange", "yellow")  # shapes whose marks are drawn black, the others' white
_NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}
_SINGULAR = {"dots": "dot", "bars": "bar", "rings": "ring"}
_CORNERS = {"square": 4, "triangle": 3, "diamond": 4, "pentagon": 5, "hexagon": 6}
_RADIUS = 0.36 * IMAGE_SIZE  # the shape's outer radius at scale 1
COMBINATIONS = len(SHAPES) * len(COLOURS) * len(MARKS) * len(COUNTS) * len(FIELDS)


@dataclasses.dataclass(frozen=True)
class Emblem:
  shape: str
  colour: str
  marks: str
  count: int
  field: str

  @property
  def ink(self) -> str:
    return "black" if self.colour in _LIGHT else "white"


def caption(emblem: Emblem) -> str:
  """What the planner may read of the image: its look, never the entity's name."""
  marks = emblem.marks if emblem.count > 1 else _SINGULAR[emblem.marks]
  article = "an" if emblem.colour[0] in "aeiou" else "a"
  return (f"{article} {emblem.colour} {emblem.shape} emblem with {_NUMBERS[emblem.count]} "
          f"{emblem.ink} {marks} on a {emblem.field} field")


def shown(emblems: dict[str, Emblem], text: str | None) -> str | None:
  """The entity whose emblem `text` captions (captions are distinct), or None."""
  return next((i for i, e in emblems.items() if caption(e) == text), None)


def _emblem(index: int) -> Emblem:
  """The index-th combination (mixed radix over the five attributes)."""
  parts = []
  for values in (SHAPES, tuple(COLOURS), MARKS, COUNTS, tuple(FIELDS)):
    index, k = divmod(index, len(values))
    parts.append(values[k])
  return Emblem(*parts)


def draw(seed: int, entity_ids: Iterable[str]) -> dict[str, Emblem]:
  """A distinct emblem per entity id, a function of `seed` and the ids' order."""
  ids = list(entity_ids)
  if len(ids) > COMBINATIONS:
    raise DatasetError(f"emblems: {len(ids)} entities, more than the {COMBINATIONS} distinct "
                       "emblems")
  shuffled = [_emblem(k) for k in random.Random(f"emblems:{seed}").sample(range(COMBINATIONS),
                                                                          COMBINATIONS)]
  # every (shape, colour, field) once before any twice: those cover most of the picture, so
  # emblems that differ only in their marks come last (past 256 entities)
  seen: dict[tuple, int] = {}
  rank = []
  for e in shuffled:
    big = (e.shape, e.colour, e.field)
    rank.append(seen.get(big, 0))
    seen[big] = rank[-1] + 1
  order = sorted(range(COMBINATIONS), key=lambda k: rank[k])
  return {i: shuffled[k] for i, k in zip(ids, order)}


@dataclasses.dataclass(frozen=True)
class _Pose:
  """Local emblem coordinates (origin at the shape's centre, y down) -> pixels."""
  angle: float = 0.0  # radians
  scale: float = 1.0
  dx: float = 0.0
  dy: float = 0.0

  def __call__(self, x: float, y: float) -> tuple[float, float]:
    c, s = math.cos(self.angle), math.sin(self.angle)
    x, y = x * self.scale, y * self.scale
    return (IMAGE_SIZE / 2 + self.dx + c * x - s * y, IMAGE_SIZE / 2 + self.dy + s * x + c * y)


def _pose(variant: int, key: str) -> tuple[_Pose, int]:
  """Variant 0: upright and centred; otherwise a small seeded turn, scale, shift and tint."""
  if variant == 0:
    return _Pose(), 0
  rng = random.Random(f"emblem-variant:{key}:{variant}")
  return (_Pose(math.radians(rng.uniform(-5, 5)), rng.uniform(0.94, 1.0),
                rng.uniform(-8, 8), rng.uniform(-8, 8)), rng.randint(-8, 8))


def _outline(shape: str, r: float) -> list[tuple[float, float]]:
  if shape == "star":
    return [((r if k % 2 == 0 else 0.45 * r) * math.cos(-math.pi / 2 + k * math.pi / 5),
             (r if k % 2 == 0 else 0.45 * r) * math.sin(-math.pi / 2 + k * math.pi / 5))
            for k in range(10)]
  if shape == "cross":
    a, b = 0.36 * r, r
    return [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a),
            (-b, a), (-b, -a), (-a, -a)]
  n = _CORNERS[shape]
  start = -math.pi / 2 if shape in ("triangle", "pentagon", "diamond") else -math.pi / 4
  if shape == "hexagon":
    start = 0.0
  return [(r * math.cos(start + 2 * math.pi * k / n), r * math.sin(start + 2 * math.pi * k / n))
          for k in range(n)]


def _draw_marks(draw, emblem: Emblem, pose: _Pose, ink: tuple[int, int, int]) -> None:
  """A centred row of `count` marks inside every shape's inner area (radius ~0.42 R), each
  narrower than the gap to the next."""
  inner = 0.42 * _RADIUS
  step = 1.5 * inner / max(emblem.count - 1, 1)
  xs = [0.0] if emblem.count == 1 else [-0.75 * inner + k * step for k in range(emblem.count)]
  size = min(0.2 * inner, 0.32 * step) * pose.scale
  for x in xs:
    cx, cy = pose(x, 0.0)
    if emblem.marks == "bars":
      draw.polygon([pose(x + dx, dy) for dx, dy in ((-0.12 * inner, -0.6 * inner),
                                                    (0.12 * inner, -0.6 * inner),
                                                    (0.12 * inner, 0.6 * inner),
                                                    (-0.12 * inner, 0.6 * inner))], fill=ink)
    elif emblem.marks == "dots":
      draw.ellipse((cx - size, cy - size, cx + size, cy + size), fill=ink)
    else:
      draw.ellipse((cx - 1.2 * size, cy - 1.2 * size, cx + 1.2 * size, cy + 1.2 * size),
                   outline=ink, width=max(3, round(0.4 * size)))


def render(emblem: Emblem, variant: int = 0, key: str = "") -> np.ndarray:
  """The emblem as uint8 [448, 448, 3]; variant > 0 (with `key`, e.g. the entity id) a seeded
  near copy of variant 0."""
  from PIL import Image, ImageDraw  # Pillow: only image worlds draw

  pose, tint = _pose(variant, key)
  field = tuple(min(255, max(0, v + tint)) for v in FIELDS[emblem.field])
  image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), field)
  draw_ = ImageDraw.Draw(image)
  colour = COLOURS[emblem.colour]
  if emblem.shape == "circle":
    cx, cy = pose(0.0, 0.0)
    r = _RADIUS * pose.scale
    draw_.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
  else:
    draw_.polygon([pose(x, y) for x, y in _outline(emblem.shape, _RADIUS)], fill=colour)
  _draw_marks(draw_, emblem, pose, (20, 20, 20) if emblem.ink == "black" else (250, 250, 250))
  return np.asarray(image, np.uint8)
