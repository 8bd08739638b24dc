"""Qwen2.5-VL's vision tower as plain functions: `tower(params, config, pixel_values, grids)`.

What it computes (transformers' `Qwen2_5_VisionTransformerPretrainedModel`):
- patch embedding: each patch (3 channels x 2 frames x 14 x 14 pixels, as `patchify` lays it
  out) times the Conv3d's kernel, a matmul since the stride equals the kernel;
- the patches reordered window by window (`layout`): a window is `window_size / patch_size`
  patches square (8 x 8 = 64 patches at Qwen2.5-VL's 112 px), whole 2 x 2 merge groups;
- `depth` blocks: RMSNorm, attention within a window (or, in the `fullatt_block_indexes`
  blocks, within the image) with the 2-D rotary (head_dim / 4 frequencies for the patch's row,
  as many for its column), RMSNorm, a SwiGLU MLP with biases;
- the merger: RMSNorm, each 2 x 2 group of patches concatenated, Linear, GELU, Linear to the
  language model's width; the merged tokens back in the image's order (row-major over the
  merged grid, as the processor lays out the image pad tokens).

Each image is `grid` (t, h, w) patches, h and w multiples of the merge size; the layout (window
order, attention groups, rotary positions) is numpy computed from the grids, so shapes are
static per set of grid sizes: a 448 x 448 image is (1, 32, 32): 1024 patches, 16 windows of
64 patches, 256 merged tokens. Images only (t = 1); video is not supported.

Weights follow `llm.params`' scheme: one `Weight` per tensor in `VISION_WEIGHTS`, per-block
tensors stacked over the blocks ("layers"), names as Hugging Face checkpoints store them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from morse_jax.llm.config import ConfigError
from morse_jax.llm.params import Weight


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The vision tower's architecture (config.json's `vision_config`). Hashable (static jit arg)."""

  depth: int
  hidden_size: int
  intermediate_size: int
  num_heads: int
  out_hidden_size: int
  fullatt_block_indexes: tuple[int, ...]
  window_size: int = 112
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  in_channels: int = 3
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6  # fixed in transformers' vision blocks and merger

  def __post_init__(self):
    for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
                 "window_size", "patch_size", "temporal_patch_size", "spatial_merge_size",
                 "in_channels"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"vision_config.{name} must be a positive integer, got {value!r}")
    if self.hidden_size % self.num_heads or self.head_dim % 4:
      raise ConfigError(f"vision_config: hidden_size {self.hidden_size} / num_heads "
                        f"{self.num_heads} must be a whole head_dim divisible by 4 (2-D rotary)")
    bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
    if bad:
      raise ConfigError(f"vision_config.fullatt_block_indexes {bad} are not blocks of depth "
                        f"{self.depth}")
    if self.window_size % (self.patch_size * self.spatial_merge_size):
      raise ConfigError(f"vision_config.window_size {self.window_size} must be a multiple of "
                        f"patch_size x spatial_merge_size "
                        f"({self.patch_size * self.spatial_merge_size})")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:
    return self.spatial_merge_size ** 2

  @property
  def image_factor(self) -> int:
    """Image sides must be multiples of this many pixels (28 for Qwen2.5-VL)."""
    return self.patch_size * self.spatial_merge_size

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "VisionConfig":
    def need(key):
      if hf.get(key) is None:
        raise ConfigError(f"{source}: required field vision_config.{key!r} is missing")
      return hf[key]

    if hf.get("hidden_act", "silu") != "silu":
      raise ConfigError(f"{source}: vision_config.hidden_act {hf['hidden_act']!r} is not "
                        f"supported (only 'silu')")
    rope = hf.get("rope_parameters") or {}
    try:
      return cls(depth=need("depth"), hidden_size=need("hidden_size"),
                 intermediate_size=need("intermediate_size"), num_heads=need("num_heads"),
                 out_hidden_size=need("out_hidden_size"),
                 fullatt_block_indexes=tuple(int(i) for i in need("fullatt_block_indexes")),
                 window_size=hf.get("window_size", 112), patch_size=hf.get("patch_size", 14),
                 temporal_patch_size=hf.get("temporal_patch_size", 2),
                 spatial_merge_size=hf.get("spatial_merge_size", 2),
                 in_channels=hf.get("in_channels", 3),
                 rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))))
    except ConfigError as e:
      raise ConfigError(f"{source}: {e}") from None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VisionBlockParams:
  """Per-block tensors stacked over the blocks on axis 0 ([out, in] as torch stores them)."""

  norm1: jax.Array
  w_qkv: jax.Array  # rows: q, k, v, each head-major
  b_qkv: jax.Array
  w_proj: jax.Array
  b_proj: jax.Array
  norm2: jax.Array
  w_gate: jax.Array
  b_gate: jax.Array
  w_up: jax.Array
  b_up: jax.Array
  w_down: jax.Array
  b_down: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class VisionParams:
  patch_embed: jax.Array  # [d, c, t, p, p]: the Conv3d kernel as stored
  blocks: VisionBlockParams
  merger_norm: jax.Array
  merger_w1: jax.Array  # [d * merge_unit, d * merge_unit]
  merger_b1: jax.Array
  merger_w2: jax.Array  # [out, d * merge_unit]
  merger_b2: jax.Array


def vision_axis_sizes(config: VisionConfig) -> dict[str, int]:
  c = config
  return {"layers": c.depth, "embed": c.hidden_size, "qkv": 3 * c.hidden_size,
          "mlp": c.intermediate_size, "merged": c.hidden_size * c.merge_unit,
          "out": c.out_hidden_size, "channels": c.in_channels, "frames": c.temporal_patch_size,
          "patch": c.patch_size}


def weight_shape(weight: Weight, config: VisionConfig) -> tuple[int, ...]:
  sizes = vision_axis_sizes(config)
  return tuple(sizes[axis] for axis in weight.axes)


def _block(axes, init, hf):
  return Weight(("layers",) + axes, init, f"visual.blocks.{{i}}.{hf}", "")


VISION_WEIGHTS = VisionParams(
    patch_embed=Weight(("embed", "channels", "frames", "patch", "patch"), "normal",
                       "visual.patch_embed.proj.weight", ""),
    blocks=VisionBlockParams(
        norm1=_block(("embed",), "norm", "norm1.weight"),
        w_qkv=_block(("qkv", "embed"), "normal", "attn.qkv.weight"),
        b_qkv=_block(("qkv",), "normal", "attn.qkv.bias"),
        w_proj=_block(("embed", "embed"), "normal", "attn.proj.weight"),
        b_proj=_block(("embed",), "normal", "attn.proj.bias"),
        norm2=_block(("embed",), "norm", "norm2.weight"),
        w_gate=_block(("mlp", "embed"), "normal", "mlp.gate_proj.weight"),
        b_gate=_block(("mlp",), "normal", "mlp.gate_proj.bias"),
        w_up=_block(("mlp", "embed"), "normal", "mlp.up_proj.weight"),
        b_up=_block(("mlp",), "normal", "mlp.up_proj.bias"),
        w_down=_block(("embed", "mlp"), "normal", "mlp.down_proj.weight"),
        b_down=_block(("embed",), "normal", "mlp.down_proj.bias"),
    ),
    merger_norm=Weight(("embed",), "norm", "visual.merger.ln_q.weight", ""),
    merger_w1=Weight(("merged", "merged"), "normal", "visual.merger.mlp.0.weight", ""),
    merger_b1=Weight(("merged",), "normal", "visual.merger.mlp.0.bias", ""),
    merger_w2=Weight(("out", "merged"), "normal", "visual.merger.mlp.2.weight", ""),
    merger_b2=Weight(("out",), "normal", "visual.merger.mlp.2.bias", ""),
)


def init_random(config: VisionConfig, key: jax.Array, dtype=jnp.float32,
                scale: float = 0.02) -> VisionParams:
  """Random weights by each Weight's init (norms 1), one key per tensor; for tests and demos."""
  leaves, treedef = jax.tree.flatten(VISION_WEIGHTS)
  out = []
  for w, k in zip(leaves, jax.random.split(key, len(leaves))):
    shape = weight_shape(w, config)
    value = jnp.ones(shape) if w.init == "norm" else scale * jax.random.normal(k, shape)
    out.append(value.astype(dtype))
  return jax.tree.unflatten(treedef, out)


def abstract_params(config: VisionConfig, dtype=jnp.bfloat16) -> VisionParams:
  """VisionParams of `jax.ShapeDtypeStruct`s: the weights' shapes without allocating them."""
  return jax.tree.map(lambda w: jax.ShapeDtypeStruct(weight_shape(w, config), dtype),
                      VISION_WEIGHTS)


# Qwen2.5-VL-7B-Instruct's vision_config (its config.json).
QWEN25_VL_7B = VisionConfig(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                            out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31))


# ---- images in ----

Grid = tuple[int, int, int]  # (t, h, w) in patches


def check_image_size(height: int, width: int, config: VisionConfig) -> None:
  """Refuses (ValueError, naming the size) an image the tower does not take: sides must be
  positive multiples of patch_size x spatial_merge_size (28 px)."""
  f = config.image_factor
  if height <= 0 or width <= 0 or height % f or width % f:
    raise ValueError(f"image of {height} x {width} px (height x width): the vision tower takes "
                     f"sides that are multiples of {f} px (patch {config.patch_size} x merge "
                     f"{config.spatial_merge_size}), e.g. 448 x 448; resize it first")


# The processor's mean / std (Qwen2VLImageProcessor: OpenAI CLIP's), per RGB channel.
IMAGE_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
IMAGE_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


def normalize(image: np.ndarray) -> np.ndarray:
  """A uint8 RGB image [H, W, 3] (as decoded) -> float32 [3, H, W], rescaled to [0, 1] and
  normalised by the processor's mean / std: what `patchify` takes."""
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"image: expected uint8 [H, W, 3], got {image.dtype} {list(image.shape)}")
  return ((image.astype(np.float32) / 255.0 - IMAGE_MEAN) / IMAGE_STD).transpose(2, 0, 1)


# The static path's side in px: APEx's executor resizes every image to 448 x 448.
IMAGE_SIZE = 448


def image_grid(config: VisionConfig, height: int = IMAGE_SIZE, width: int = IMAGE_SIZE) -> Grid:
  """The grid (1, h, w) in patches of a height x width px image (refused as check_image_size)."""
  check_image_size(height, width, config)
  return (1, height // config.patch_size, width // config.patch_size)


def patchify(image: np.ndarray, config: VisionConfig) -> tuple[np.ndarray, Grid]:
  """A normalised image [3, H, W] (float; the processor's rescale and mean / std already
  applied) -> (pixel_values [h * w, patch_dim], grid (1, h, w)) in transformers' processor
  layout: patches grouped by 2 x 2 merge group, row-major over the merged grid, each patch
  (channel, frame, row, column) with the one image repeated over the temporal patch."""
  image = np.asarray(image)
  if image.ndim != 3 or image.shape[0] != config.in_channels:
    raise ValueError(f"image of shape {image.shape}: expected [{config.in_channels}, H, W]")
  c, height, width = image.shape
  check_image_size(height, width, config)
  p, m = config.patch_size, config.spatial_merge_size
  gh, gw = height // p, width // p
  x = image.reshape(c, gh // m, m, p, gw // m, m, p)
  x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, c, p, p]
  x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (config.temporal_patch_size, p, p))
  return np.ascontiguousarray(x.reshape(gh * gw, config.patch_dim)), (1, gh, gw)


def _check_grids(grids: Sequence[Grid], config: VisionConfig) -> list[Grid]:
  out = []
  for grid in grids:
    t, h, w = (int(v) for v in grid)
    m = config.spatial_merge_size
    if t != 1:
      raise ValueError(f"grid {tuple(grid)}: only images (t = 1) are supported, not video")
    if h <= 0 or w <= 0 or h % m or w % m:
      raise ValueError(f"grid {tuple(grid)}: an image of {h * config.patch_size} x "
                       f"{w * config.patch_size} px; sides must be multiples of "
                       f"{config.image_factor} px")
    out.append((t, h, w))
  return out


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each patch goes, from the grids alone (numpy; static per set of grid sizes).

  order: [n / merge_unit] merge groups in window order (transformers' `window_index`);
    `unorder` its inverse. rows / cols: [n] each patch's row and column in its image, in window
    order (the rotary's positions). windows / images: the lengths of the consecutive groups of
    patches (window order) that attend to each other in window / full-attention blocks."""

  order: np.ndarray
  unorder: np.ndarray
  rows: np.ndarray
  cols: np.ndarray
  windows: tuple[int, ...]
  images: tuple[int, ...]


def layout(grids: Sequence[Grid], config: VisionConfig) -> Layout:
  grids = _check_grids(grids, config)
  m = config.spatial_merge_size
  win = config.window_size // m // config.patch_size  # window side in merge groups
  order, windows, rows, cols, base = [], [], [], [], 0
  for _, h, w in grids:
    mh, mw = h // m, w // m
    # Rows / columns of each patch in the processor's order: merge group, then within it.
    r = np.arange(h).reshape(mh, m, 1, 1) * np.ones((1, 1, mw, m), int)
    c = np.arange(w).reshape(1, 1, mw, m) * np.ones((mh, m, 1, 1), int)
    r = r.transpose(0, 2, 1, 3).reshape(-1, m * m)  # [groups, merge_unit]
    c = c.transpose(0, 2, 1, 3).reshape(-1, m * m)
    index = np.arange(mh * mw).reshape(mh, mw)
    for wr in range(0, mh, win):
      for wc in range(0, mw, win):
        groups = index[wr:wr + win, wc:wc + win].reshape(-1)
        order.append(groups + base)
        windows.append(groups.size * m * m)
        rows.append(r[groups].reshape(-1))
        cols.append(c[groups].reshape(-1))
    base += mh * mw
  order = np.concatenate(order)
  return Layout(order=order, unorder=np.argsort(order), rows=np.concatenate(rows),
                cols=np.concatenate(cols), windows=tuple(windows),
                images=tuple(t * h * w for t, h, w in grids))


# ---- the tower ----


def _rms_norm(x, weight, eps):
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight * normed.astype(x.dtype)


def _linear(x, w, b=None):
  y = jnp.einsum("nd,fd->nf", x, w, preferred_element_type=jnp.float32)
  if b is not None:
    y = y + b
  return y.astype(x.dtype)


def _rotary(lay: Layout, config: VisionConfig):
  """cos, sin [n, 1, head_dim]: head_dim / 4 frequencies of the row, as many of the column,
  the pair repeated (rotate-half convention)."""
  spatial = config.head_dim // 2  # rotary width per axis
  inv = 1.0 / (config.rope_theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
  angles = np.concatenate([lay.rows[:, None] * inv, lay.cols[:, None] * inv], axis=-1)
  angles = np.concatenate([angles, angles], axis=-1).astype(np.float32)
  return jnp.asarray(np.cos(angles))[:, None], jnp.asarray(np.sin(angles))[:, None]


def _apply_rotary(x, cos, sin):
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def _group_attention(q, k, v, lengths: tuple[int, ...]):
  """Softmax attention within consecutive groups of the given lengths (no mask across groups):
  q, k, v [n, h, x] -> [n, h, x]. Equal groups (the static 448 path's 16 windows of 64, or whole
  images of one size) run as one batched product; unequal ones as a masked [h, n, n] product."""
  n, h, x = q.shape
  scale = x ** -0.5
  if len(set(lengths)) == 1:
    g, size = len(lengths), lengths[0]
    qg, kg, vg = (a.reshape(g, size, h, x) for a in (q, k, v))
    s = jnp.einsum("gqhx,gkhx->ghqk", qg, kg, preferred_element_type=jnp.float32) * scale
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("ghqk,gkhx->gqhx", p, vg).reshape(n, h, x)
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths))
  s = jnp.einsum("qhx,khx->hqk", q, k, preferred_element_type=jnp.float32) * scale
  s = jnp.where(seg[:, None] == seg[None, :], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
  return jnp.einsum("hqk,khx->qhx", p, v)


def _block_forward(x, bp: VisionBlockParams, cos, sin, lengths, config: VisionConfig):
  n, d = x.shape
  h = _rms_norm(x, bp.norm1, config.rms_norm_eps)
  qkv = _linear(h, bp.w_qkv, bp.b_qkv).reshape(n, 3, config.num_heads, config.head_dim)
  q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
  q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
  a = _group_attention(q, k, v, lengths).reshape(n, d)
  x = x + _linear(a, bp.w_proj, bp.b_proj)
  h = _rms_norm(x, bp.norm2, config.rms_norm_eps)
  gate, up = _linear(h, bp.w_gate, bp.b_gate), _linear(h, bp.w_up, bp.b_up)
  return x + _linear(jax.nn.silu(gate) * up, bp.w_down, bp.b_down)


def tower(params: VisionParams, config: VisionConfig, pixel_values, grids: Sequence[Grid]):
  """pixel_values [n, patch_dim] (`patchify`'s layout, images concatenated) of images `grids`
  -> merged tokens [n / merge_unit, out_hidden_size], image after image, each row-major over its
  merged grid: what replaces the image pad tokens. Jit it with `grids` static
  (`jax.jit(tower, static_argnums=(1, 3))`, grids a tuple of tuples)."""
  lay = layout(grids, config)
  n = sum(lay.images)
  if pixel_values.shape != (n, config.patch_dim):
    raise ValueError(f"pixel_values of shape {tuple(pixel_values.shape)}: grids {list(grids)} "
                     f"need [{n}, {config.patch_dim}]")
  d, u = config.hidden_size, config.merge_unit
  kernel = params.patch_embed.reshape(d, config.patch_dim)
  x = _linear(pixel_values.astype(kernel.dtype), kernel)  # [n, d], processor order
  x = x.reshape(n // u, u, d)[lay.order].reshape(n, d)  # window order
  cos, sin = _rotary(lay, config)
  is_full = np.isin(np.arange(config.depth), config.fullatt_block_indexes)

  def body(x, xs):  # one compiled block, its attention groups chosen per block
    bp, full = xs
    return jax.lax.cond(
        full, lambda x: _block_forward(x, bp, cos, sin, lay.images, config),
        lambda x: _block_forward(x, bp, cos, sin, lay.windows, config), x), None

  x, _ = jax.lax.scan(body, x, (params.blocks, jnp.asarray(is_full)))
  x = _rms_norm(x, params.merger_norm, config.rms_norm_eps).reshape(n // u, u * d)
  x = _linear(jax.nn.gelu(_linear(x, params.merger_w1, params.merger_b1), approximate=False),
              params.merger_w2, params.merger_b2)
  return x[lay.unorder]
