"""The update step and the sampler at a run's real shapes, without an accelerator.

Every argument is an abstract array (`jax.ShapeDtypeStruct`) carrying the sharding the code gives
it on a mesh: the backbone, the experts and the router by their declared logical axes
(`llm.params.WEIGHTS`, `lora.experts.expert_axes`, `lora.router.ROUTER_AXES`), the optimiser state
as the parameters it mirrors, rows (update batch, prompts, routes, KV cache rows) over `data`
(`sharding.shard_rows`, `CACHE_AXES`), as `rl.update.run` and `llm.sample` place them. Nothing is allocated, so the
same arguments serve two checks:

- `export`: `jax.export` for platforms "tpu" / "cuda" on an `AbstractMesh` (no devices needed);
  `arg_specs` reads back the shardings the exported module declares for its inputs.
- `memory`: an ahead-of-time compile on a mesh of (fake) CPU devices and its per-device
  argument / output / temporary bytes. XLA:CPU's buffer assignment is not TPU's or GPU's (other
  fusions, no rematerialisation pass, f32 where CPU lacks bf16 dots), so these are estimates.

Dimension letters: n update rows, T row width, R packed rows, S packed width, G routes, b sampler
rows, p prompt slots (see llm.params for the model's).
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from morse_jax.llm import attention as attention_lib
from morse_jax.llm import sharding as sharding_lib
from morse_jax.llm import model as model_lib
from morse_jax.llm.config import LlmConfig
from morse_jax.llm.model import forward, init_cache
from morse_jax.llm.params import abstract_params
from morse_jax.llm.vision import VisionConfig
from morse_jax.llm.vl import ImageRows
from morse_jax.llm import vision as vision_lib
from morse_jax.llm import vl as vl_lib
from morse_jax.llm.sampling import (PREFILL_CHUNK, PREFILL_TOKENS, GenerationSettings,
                                    SamplingConfig, bucket, generate_padded, length_bucket,
                                    prefill)
from morse_jax.lora import router as router_lib
from morse_jax.lora.experts import (LoraConfig, adapter_of, expert_axes, init_experts, target_dims,
                                    target_weight)
from morse_jax.lora.mixture import Routes, adapted_linear
from morse_jax.rl import logprobs
from morse_jax.rl import train_step as ts
from morse_jax.rl import update as update_lib
from morse_jax.rl.batch import PolicyBatch, RouterBatch, padded_rows
from morse_jax.rl.shared_prefix import SharedPrefix


def abstract_mesh(data: int, model: int = 1) -> AbstractMesh:
  """The ('data', 'model') mesh of `sharding.make_mesh`, without devices."""
  return AbstractMesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


@dataclasses.dataclass(frozen=True)
class RunShapes:
  """One update and one sampler call of a run: `nodes` nodes of B routes x M candidates, padded
  as `rl.batch` / `compaction.share_prefixes` / `llm.sample` pad them, at the largest the run can
  make them (every completion at the generation budget, no node left out as flat)."""

  nodes: int
  routes_per_node: int  # B
  group_size: int  # M
  prompt_tokens: int  # a node's prompt
  max_new_tokens: int  # the generation budget
  micro_batches: int = 1
  share_prompts: bool = True  # with one micro-batch, each route's prompt runs once
  route_width: int = 3  # experts per row (role + top-K subtask experts)
  embed_dim: int = 2560  # the router's input
  data: int = 1  # the mesh's data axis: row counts are multiples of it
  images: int = 0  # Qwen2.5-VL: images per row, each `image_tokens` of its prompt tokens
  image_tokens: int = 256  # a 448 x 448 image's

  @property
  def shared(self) -> bool:  # no packed layout for rows with images (compaction.share_prefixes)
    return self.share_prompts and self.micro_batches == 1 and not self.images

  @property
  def feature_slots(self) -> int:  # k of `vl.ImageRows`: a row's image tokens, a power of two
    return bucket(self.images * self.image_tokens, minimum=1)

  @property
  def rows(self) -> int:  # n, as rl.batch.layout pads them
    return padded_rows(self.nodes * self.routes_per_node * self.group_size,
                       math.lcm(self.data, self.micro_batches))

  @property
  def width(self) -> int:  # T: a row's tokens, or its suffix in the shared layout
    if self.shared:
      return length_bucket(self.max_new_tokens)
    return length_bucket(self.prompt_tokens + self.max_new_tokens)

  @property
  def packed_rows(self) -> int:  # R: one per route
    return padded_rows(self.nodes * self.routes_per_node, math.lcm(self.data, self.micro_batches))

  @property
  def packed_width(self) -> int:  # S: the prompt once, then M suffixes
    return length_bucket(self.prompt_tokens + self.group_size * self.max_new_tokens)

  @property
  def num_routes(self) -> int:  # G
    return bucket(self.nodes, minimum=1) * self.routes_per_node

  @property
  def sample_rows(self) -> int:  # b, as llm.sample pads them
    multiple = math.lcm(self.group_size, self.data)
    return -(-bucket(self.nodes * self.routes_per_node * self.group_size, 1) // multiple) * multiple

  @property
  def prompt_len(self) -> int:
    return length_bucket(self.prompt_tokens)

  @property
  def gen_len(self) -> int:
    return bucket(self.max_new_tokens)


def _spec(mesh, logical, shape, rules=sharding_lib.ShardingRules()):
  return rules.sharding(logical, shape, mesh)


def _array(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _rows(mesh, shape, dtype):
  """Rows on axis 0 over the batch axis (`sharding.shard_rows`); scalars replicated."""
  logical = ("batch",) + (None,) * (len(shape) - 1) if shape else ()
  return _array(shape, dtype, _spec(mesh, logical, shape))


def _replicated(mesh, tree):
  return jax.tree.map(lambda a: _array(a.shape, a.dtype, NamedSharding(mesh, PartitionSpec())),
                      tree)


def _declared(mesh, tree, axes):
  """Abstract arrays laid out by their logical axes (`sharding.shardings`)."""
  return jax.tree.map(lambda a, s: None if a is None else _array(a.shape, a.dtype, s), tree,
                      sharding_lib.shardings(tree, axes, mesh), is_leaf=lambda x: x is None)


def _mirroring(mesh, state, params):
  """Optimiser state laid out as the parameters it mirrors: a leaf whose path ends with a
  parameter's path and has its shape (optax's mu / nu) takes that parameter's sharding; the rest
  (step counts) is replicated."""
  by_path = [(jax.tree_util.keystr(p), x) for p, x in
             jax.tree_util.tree_flatten_with_path(params)[0]]

  def place(path, x):
    key = jax.tree_util.keystr(path)
    same = [p for name, p in by_path if key.endswith(name) and p.shape == x.shape]
    sharding = same[0].sharding if same else NamedSharding(mesh, PartitionSpec())
    return _array(x.shape, x.dtype, sharding)

  return jax.tree_util.tree_map_with_path(place, state)


def backbone(config: LlmConfig, mesh, dtype=jnp.bfloat16):
  """Params of abstract arrays laid out by `sharding.param_shardings`."""
  return _declared(mesh, abstract_params(config, dtype), sharding_lib.PARAM_AXES)


def experts(lora: LoraConfig, config: LlmConfig, mesh):
  """The LoRA experts (float32, as `Trainer.init_state` makes them), laid out by `expert_axes`."""
  tree = jax.eval_shape(lambda k: init_experts(lora, config, k), jax.random.key(0))
  return _declared(mesh, tree, expert_axes(tree))


def update_args(config: LlmConfig, lora: LoraConfig, router: router_lib.RouterConfig | None,
                step: ts.StepConfig, shapes: RunShapes, mesh, *, dtype=jnp.bfloat16,
                kernel: str = "gather"):
  """(args, kwargs) of `train_step` as `rl.update.Update` calls it (no rows left out)."""
  n, t, e, g = shapes.rows, shapes.width, shapes.route_width, shapes.num_routes
  rows = lambda shape, dtype: _rows(mesh, shape, dtype)
  routes = lambda count: Routes(idx=rows((count, e), jnp.int32), w=rows((count, e), jnp.float32))
  shared = None
  if shapes.shared:
    r, s = shapes.packed_rows, shapes.packed_width
    shared = SharedPrefix(tokens=rows((r, s), jnp.int32), positions=rows((r, s), jnp.int32),
                          segments=rows((r, s), jnp.int32), prev=rows((r, s), jnp.int32),
                          row=rows((n,), jnp.int32), col=rows((n, t), jnp.int32),
                          routes=routes(r))
  policy = PolicyBatch(tokens=rows((n, t), jnp.int32), attention_mask=rows((n, t), jnp.int32),
                       loss_mask=rows((n, t), jnp.float32), logp_old=rows((n, t), jnp.float32),
                       rewards=rows((n,), jnp.float32), route=rows((n,), jnp.int32),
                       valid=rows((n,), jnp.float32), routes=routes(n), shared=shared,
                       images=image_rows(config, shapes, mesh, n, t, dtype))
  expert_tree = experts(lora, config, mesh)
  router_params = router_batch = None
  if router is not None:
    router_params = _declared(mesh, jax.eval_shape(
        lambda k: router_lib.init_router(router, shapes.embed_dim, lora.num_subtask_experts, k),
        jax.random.key(0)), router_lib.ROUTER_AXES)
    router_batch = _replicated(mesh, RouterBatch(
        embeddings=jax.ShapeDtypeStruct((g, shapes.embed_dim), jnp.float32),
        subtask_routes=jax.ShapeDtypeStruct((g, router.top_k), jnp.int32),
        mask=jax.ShapeDtypeStruct((g,), jnp.float32)))
  expert_state, router_state = jax.eval_shape(
      lambda x, r: ts.init_opt_states(x, r, step), expert_tree, router_params)
  opt_states = (_mirroring(mesh, expert_state, expert_tree),
                None if router_state is None else _mirroring(mesh, router_state, router_params))
  replicated = NamedSharding(mesh, PartitionSpec())
  update_router = _array((), jnp.bool_, replicated)
  flat = _array((g // shapes.routes_per_node,), jnp.bool_, replicated)
  args = (backbone(config, mesh, dtype), expert_tree, router_params, opt_states, policy,
          router_batch)
  update = update_lib.Update(config, lora, step, router, kernel=kernel,
                             routes_per_node=shapes.routes_per_node)
  kwargs = dict(update=update, num_routes=g, update_router=update_router, flat=flat)
  return args, kwargs


def _sampler_inputs(config, lora, shapes, mesh, rows, kernel, dtype):
  """(params, adapter or None) for `rows` sampler rows."""
  adapter = None
  if lora is not None:
    e = shapes.route_width
    adapter = adapter_of(experts(lora, config, mesh),
                         Routes(idx=_rows(mesh, (rows, e), jnp.int32),
                                w=_rows(mesh, (rows, e), jnp.float32)), lora, config, kernel)
  return backbone(config, mesh, dtype), adapter


def sample_args(config: LlmConfig, lora: LoraConfig | None, shapes: RunShapes, mesh, *,
                dtype=jnp.bfloat16, kernel: str = "gather",
                sampling: SamplingConfig = SamplingConfig()):
  """(args, kwargs) of `generate_padded` as `llm.sample` calls it for a B x M rollout
  (each route's prompt prefilled once), in the accelerator layout (stacked layers)."""
  b, p = shapes.sample_rows, shapes.prompt_len
  params, adapter = _sampler_inputs(config, lora, shapes, mesh, b, kernel, dtype)
  key_type = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), b)).dtype
  settings = GenerationSettings(shapes.gen_len, sampling, eos_ids=(0,),
                                prompt_repeats=shapes.group_size, unstack=False)
  args = (params, config, _rows(mesh, (b, p), jnp.int32), _rows(mesh, (b, p), jnp.int32),
          _rows(mesh, (b,), key_type), _array((), jnp.int32, NamedSharding(mesh, PartitionSpec())),
          settings)
  kwargs = dict(mesh=mesh, rules=sharding_lib.ShardingRules(), adapter=adapter,
                active=_rows(mesh, (b,), jnp.bool_), images=image_rows(config, shapes, mesh, b, p,
                                                                       dtype))
  return args, kwargs


def image_rows(config: LlmConfig, shapes: RunShapes, mesh, rows: int, tokens: int,
               dtype=jnp.bfloat16) -> ImageRows | None:
  """The `vl.ImageRows` of `rows` rows of `tokens` (rows over `data`); None without images."""
  if not shapes.images:
    return None
  rows_of = lambda shape, dtype: _rows(mesh, shape, dtype)
  return ImageRows(features=rows_of((rows, shapes.feature_slots, config.hidden_size), dtype),
                   index=rows_of((rows, tokens), jnp.int32),
                   positions=rows_of((rows, 3, tokens), jnp.int32))


def tower_args(vision: VisionConfig, images: int, mesh, dtype=jnp.bfloat16):
  """(args, kwargs) of the vision tower over `images` 448 x 448 images on one device's share
  (`vl.image_features`: passes of `vl.TOWER_IMAGES`), weights and pixels replicated."""
  params = _replicated(mesh, vision_lib.abstract_params(vision, dtype))
  grid = vision_lib.image_grid(vision)
  patches = images * grid[1] * grid[2]
  pixels = _array((patches, vision.patch_dim), jnp.float32, NamedSharding(mesh, PartitionSpec()))
  return (params, vision, pixels, grid, images, min(images, vl_lib.TOWER_IMAGES)), {}


def tower_fn():
  """The tower in passes, as `vl.image_features` runs many images of one size."""
  return vl_lib._tower_passes  # pylint: disable=protected-access


def tower_estimate(vision: VisionConfig, args) -> dict:
  """Per-device bytes of the tower over a call's images, by hand: its weights, the pixels (f32)
  and the merged tokens out (in the weights' dtype), and one pass's activations: per patch of
  its images the block's working set (residual, norm, q, k, v, attention out and projection:
  7 d; gate, up, product: 3 f) and, in a full-attention block, the image's scores (f32) and
  probabilities over its patches."""
  params, _, pixels, grid, images, per_pass = args
  itemsize = np.dtype(params.patch_embed.dtype).itemsize
  patches = grid[1] * grid[2]
  per_patch = (itemsize * (7 * vision.hidden_size + 3 * vision.intermediate_size)
               + (4 + itemsize) * vision.num_heads * patches)
  activations = per_pass * patches * per_patch
  out = images * patches // vision.merge_unit * vision.out_hidden_size * itemsize
  weights = shard_bytes(params)
  arguments = weights + shard_bytes(pixels)
  return {"arguments": arguments, "weights": weights, "activations": activations,
          "features": out, "total": arguments + activations + out}


def cache(config: LlmConfig, rows: int, slots: int, mesh, dtype=jnp.bfloat16):
  """An abstract KVCache laid out by `sharding.CACHE_AXES`."""
  shape = jax.eval_shape(lambda: init_cache(config, rows, slots, dtype))
  return jax.tree.map(lambda a, s: _array(a.shape, a.dtype, s), shape,
                      sharding_lib.cache_shardings(shape, mesh))


def prefill_fn(config: LlmConfig, slots: int, mesh):
  """The sampler's prefill into a fresh cache of `slots` slots (laid out as generate_padded
  lays it): (params, tokens, mask, adapter) -> (logits [b, 1, v], cache)."""
  def run(params, tokens, attention_mask, adapter):
    fresh = init_cache(config, tokens.shape[0], slots, params.embed.dtype)
    fresh = jax.lax.with_sharding_constraint(fresh, sharding_lib.cache_shardings(fresh, mesh))
    return prefill(params, config, tokens, attention_mask, fresh, adapter)
  return jax.jit(run)


def decode_step_fn(config: LlmConfig):
  """One decode step, the cache donated: (params, token [b, 1], cache, adapter) -> (logits,
  cache)."""
  return jax.jit(lambda params, token, kv, adapter: forward(params, config, token, cache=kv,
                                                            adapter=adapter),
                 donate_argnums=(2,))


def prefill_args(config, lora, shapes, mesh, *, dtype=jnp.bfloat16, kernel="gather"):
  """(fn, args): the prefill of one run's distinct prompts (b / M rows)."""
  rows, p = shapes.sample_rows // shapes.group_size, shapes.prompt_len
  params, adapter = _sampler_inputs(config, lora, shapes, mesh, rows, kernel, dtype)
  fn = prefill_fn(config, p + shapes.gen_len, mesh)
  return fn, (params, _rows(mesh, (rows, p), jnp.int32), _rows(mesh, (rows, p), jnp.int32),
              adapter)


def decode_args(config, lora, shapes, mesh, *, dtype=jnp.bfloat16, kernel="gather"):
  """(fn, args): one decode step over all b rows and a full-length cache."""
  b = shapes.sample_rows
  params, adapter = _sampler_inputs(config, lora, shapes, mesh, b, kernel, dtype)
  kv = cache(config, b, shapes.prompt_len + shapes.gen_len, mesh, dtype)
  return decode_step_fn(config), (params, _rows(mesh, (b, 1), jnp.int32), kv, adapter)


def mixture_args(config: LlmConfig, lora: LoraConfig, rows: int, tokens: int, mesh, *,
                 target: str = "q", route_width: int = 3, dtype=jnp.bfloat16):
  """(x, w, bias, a, b, routes) of `adapted_linear` on one adapted projection: x rows over data,
  w and one layer's experts as their declared axes lay them out."""
  d_in, d_out = target_dims(target, config)
  k, r, e = lora.num_experts, lora.rank, route_width
  one_layer = lambda axes: axes[1:]  # the declared axes without the layer axis
  ab_axes = expert_axes({target: None})[target]
  declared = lambda axes, shape: _array(shape, dtype, _spec(mesh, one_layer(axes), shape))
  x = _rows(mesh, (rows, tokens, d_in), dtype)
  w = declared(target_weight(target).axes, (d_out, d_in))
  a, b = declared(ab_axes.a, (k, d_in, r)), declared(ab_axes.b, (k, r, d_out))
  routes = Routes(idx=_rows(mesh, (rows, e), jnp.int32), w=_rows(mesh, (rows, e), jnp.float32))
  return x, w, None, a, b, routes


def mixture_fn(kernel: str, scale: float):
  return jax.jit(lambda x, w, bias, a, b, routes: adapted_linear(x, w, bias, a, b, routes, scale,
                                                                 kernel))


def train_step_fn():
  """The jitted update step itself, the train state donated (its static arguments come as
  keyword arguments)."""
  return ts.jitted()


def sampler_fn():
  return generate_padded


# ---- checks ----

def export(fn, args, kwargs=None, *, platform: str):
  """`jax.export` of jitted `fn` for one platform ("tpu", "cuda", "cpu")."""
  return jax.export.export(fn, platforms=[platform])(*args, **(kwargs or {}))


_DIMS = re.compile(r"sdy\.sharding = #sdy\.sharding<@\w+, \[(.*?)\]>")


def arg_specs(exported) -> dict[int, tuple[tuple[str, ...], ...] | None]:
  """flat input index -> per dimension the mesh axes that the exported main function declares
  for it (`()`: not split); None: no sharding annotation. Unused inputs, which the module drops,
  are absent."""
  text = exported.mlir_module()
  start = text.index("func.func public @main(")
  header = text[start:text.index(") -> (", start)]
  kept = list(exported.module_kept_var_idx)
  out = {}
  for chunk in re.split(r"(?=%arg\d+: )", header)[1:]:
    index = int(re.match(r"%arg(\d+)", chunk).group(1))
    dims = _DIMS.search(chunk)
    out[kept[index]] = None if dims is None else tuple(
        tuple(re.findall(r'"(\w+)"', d)) for d in re.findall(r"\{[^{}]*\}", dims.group(1)))
  return out


def spec_axes(array: jax.ShapeDtypeStruct) -> tuple[tuple[str, ...], ...]:
  """An abstract array's sharding in `arg_specs`' form: per dimension the mesh axes over which
  it is split."""
  spec = tuple(array.sharding.spec)
  spec += (None,) * (len(array.shape) - len(spec))
  return tuple(() if a is None else (a,) if isinstance(a, str) else tuple(a) for a in spec)


def declared_axes(exported, index: int, ndim: int) -> tuple[tuple[str, ...], ...] | None:
  """`arg_specs` of one flat input over its first `ndim` dimensions (a PRNG key array has one
  more, its key data), "no annotation" read as not split; None when the module dropped the
  input (unused)."""
  specs = arg_specs(exported)
  if index not in specs:
    return None
  return specs[index][:ndim] if specs[index] is not None else ((),) * ndim


def flat_inputs(args, kwargs=None) -> list[tuple[str, jax.ShapeDtypeStruct]]:
  """(path, abstract array) per flat input, in the exported module's order."""
  leaves = jax.tree_util.tree_flatten_with_path((args, kwargs or {}))[0]
  return [(jax.tree_util.keystr(p), x) for p, x in leaves if isinstance(x, jax.ShapeDtypeStruct)]


def concrete(tree, mesh):
  """The abstract arrays with their shardings moved onto `mesh` (a device mesh of the same axes)."""
  def move(x):
    if isinstance(x, jax.ShapeDtypeStruct) and isinstance(x.sharding, NamedSharding):
      return _array(x.shape, x.dtype, NamedSharding(mesh, x.sharding.spec))
    return x
  return jax.tree.map(move, tree)


def shard_bytes(tree) -> int:
  """Bytes one device holds of the abstract arrays in `tree` (their shard shapes)."""
  total = 0
  for x in jax.tree.leaves(tree):
    if not isinstance(x, jax.ShapeDtypeStruct):
      continue
    count = int(np.prod(x.sharding.shard_shape(x.shape), dtype=np.int64))
    typed_key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    total += count * (8 if typed_key else np.dtype(x.dtype).itemsize)  # a key: two uint32
  return total


def memory(fn, args, kwargs, mesh) -> dict[str, int]:
  """Per-device bytes of `fn` compiled ahead of time on the device mesh `mesh` (XLA:CPU on fake
  devices here): argument, output, alias (outputs that reuse an argument), temp, peak
  (argument + output - alias + temp), and cpu_f32_copies: temporaries that are float32
  conversions of whole bfloat16 arguments (XLA:CPU has no bf16 dot and converts the stacked
  weights; an accelerator reads them as they are). peak - cpu_f32_copies is the nearer estimate."""
  args, kwargs = concrete(args, mesh), concrete(kwargs, mesh)
  compiled = fn.trace(*args, **kwargs).lower().compile()
  stats = compiled.memory_analysis()
  out = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in
         ("argument", "output", "alias", "temp")}
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  out["cpu_f32_copies"] = _f32_copies(compiled.as_text(), (args, kwargs))
  return out


def _f32_copies(hlo: str, tree) -> int:
  """Bytes of f32 `convert`s whose shape is a bf16 argument's shard shape, at most one per such
  argument."""
  arguments: dict[tuple[int, ...], int] = {}
  for x in jax.tree.leaves(tree):
    if isinstance(x, jax.ShapeDtypeStruct) and x.dtype == jnp.bfloat16 and len(x.shape) > 1:
      shape = tuple(x.sharding.shard_shape(x.shape))
      arguments[shape] = arguments.get(shape, 0) + 1
  converts: dict[tuple[int, ...], int] = {}
  for dims in re.findall(r"= f32\[([\d,]+)\]\{[^}]*\} convert\(", hlo):
    shape = tuple(int(d) for d in dims.split(","))
    converts[shape] = converts.get(shape, 0) + 1
  return sum(4 * int(np.prod(shape)) * min(n, converts.get(shape, 0))
             for shape, n in arguments.items())


# ---- analytical per-device bytes (beside the compiled ones) ----

def _split(size: int, mesh, axis: str | None) -> int:
  """Per-device share of a dimension split over mesh axis `axis` (when it divides evenly)."""
  n = 1 if axis is None else mesh.shape[axis]
  return size // n if size % n == 0 else size


@dataclasses.dataclass(frozen=True)
class LayerWidths:
  """One device's share of a layer's widths (elements per token): the residual stream d (not
  split), query heads and q = heads x head_dim, kv = kv heads x head_dim, the MLP's f."""

  d: int
  heads: int
  q: int
  kv: int
  f: int

  @classmethod
  def of(cls, config: LlmConfig, mesh) -> "LayerWidths":
    rules = sharding_lib.ShardingRules()
    heads = _split(config.num_heads, mesh, rules.heads)
    kv = _split(config.num_kv_heads, mesh, rules.kv_heads)
    return cls(d=config.hidden_size, heads=heads, q=heads * config.head_dim,
               kv=kv * config.head_dim, f=_split(config.intermediate_size, mesh, rules.mlp))


def score_block(queries: int, keys: int) -> int:
  """Query rows x key slots of one block of scores (`llm.attention.block_size` of each)."""
  return (attention_lib.block_size(queries, attention_lib.BLOCK_Q)
          * attention_lib.block_size(keys, attention_lib.BLOCK_K))


def layer_saved_bytes(w: LayerWidths, itemsize: int) -> int:
  """Bytes per token one layer keeps for its backward pass (no remat): input, two norms, the
  residual after attention (4 d), q, k, v and the attention output (the custom VJP's
  residuals: 2 q + 2 kv), gate, up and their product (3 f), in the activations' dtype, and the
  attention's log-sum-exp (f32 per head)."""
  return itemsize * (4 * w.d + 2 * w.q + 2 * w.kv + 3 * w.f) + 4 * w.heads


def attention_bytes(w: LayerWidths, rows: int, queries: int, keys: int) -> int:
  """The attention's working set in one layer's backward pass (`llm.attention._flash_bwd`),
  f32: dq and the upcast output gradient (2 q per query), dk and dv (2 kv per key), and one
  block of scores with its probability and score gradients (3 blocks). Never [t, s]: this
  replaced the dense attention's 2 x 4 x rows x heads x t x s of scores and probabilities."""
  per_rows = 4 * (queries * 2 * w.q + keys * 2 * w.kv)
  blocks = 3 * 4 * w.heads * score_block(queries, keys)
  return rows * (per_rows + blocks)


def update_estimate(config: LlmConfig, shapes: RunShapes, mesh, args, *, remat: bool) -> dict:
  """Per-device bytes of one update, by hand: the arguments (exact shard sizes: backbone,
  experts, router, optimiser state, batch) and the activations of one micro-batch:
  - layers: without remat every layer's `layer_saved_bytes`; with remat each layer's input
    (d per token) plus one layer's saved set, recomputed during its backward pass; a pass the
    MLP runs in `model.MLP_CHUNK`-token chunks holds one chunk's gate, up and product (3 f);
  - attention: one layer's `attention_bytes` (blocks of scores, never t x t);
  - logits: `rl.logprobs` multiplies the head a chunk of c = LOGIT_CHUNK tokens at a time, so
    four f32 [rows, c, vocab / model] arrays (the chunk's logits, log-softmax and their
    gradients: with the whole [rows, tokens, vocab] at once a compiled update held all four),
    plus the final hidden states and their f32 gradient ([rows, tokens, d]).
  Activations are in the backbone's dtype (bf16 on the presets)."""
  rules = sharding_lib.ShardingRules()
  rows, tokens = ((shapes.packed_rows, shapes.packed_width) if shapes.shared
                  else (shapes.rows // shapes.micro_batches, shapes.width))
  rows = max(1, rows // mesh.shape[rules.batch])
  w = LayerWidths.of(config, mesh)
  itemsize = np.dtype(args[0].embed.dtype).itemsize
  saved = layer_saved_bytes(w, itemsize)
  mlp = itemsize * 3 * w.f  # gate, up and their product per token
  # A pass longer than model.MLP_CHUNK (and a multiple of it) holds one chunk's MLP at a time.
  mlp_tokens = (model_lib.MLP_CHUNK if tokens > model_lib.MLP_CHUNK
                and tokens % model_lib.MLP_CHUNK == 0 else tokens)
  if remat:
    layers = rows * (tokens * (itemsize * w.d * config.num_layers + saved - mlp)
                     + mlp_tokens * mlp)
  else:
    layers = rows * (tokens * (saved - mlp) * config.num_layers
                     + mlp_tokens * mlp * (1 if mlp_tokens < tokens else config.num_layers))
  attention = attention_bytes(w, rows, tokens, tokens)
  chunk = min(logprobs.LOGIT_CHUNK, tokens)
  logits = (4 * 4 * rows * chunk * _split(config.vocab_size, mesh, rules.vocab)
            + (4 + itemsize) * rows * tokens * config.hidden_size)
  activations = layers + attention + logits
  arguments = shard_bytes(args)
  return {"arguments": arguments, "layers": layers, "attention": attention, "logits": logits,
          "activations": activations, "total": arguments + activations}


def cache_row_bytes(config: LlmConfig, slots: int, mesh, itemsize: int = 2) -> int:
  """Bytes of one sampler row's KV cache at `slots` slots on one device (k and v of every
  layer, kv heads over `model`)."""
  kv = _split(config.num_kv_heads, mesh, sharding_lib.ShardingRules().kv_heads)
  return 2 * itemsize * config.num_layers * kv * slots * config.head_dim


def prefill_chunk(rows: int, prompt_slots: int) -> int:
  """The chunk `llm.sampling.prefill` runs a prompt in (its rule, for `rows` prompt rows)."""
  chunk = max(1, min(PREFILL_CHUNK, PREFILL_TOKENS // rows))
  c = 1 << (max(1, min(chunk, prompt_slots)).bit_length() - 1)
  while prompt_slots % c:
    c //= 2
  return c


def sample_estimate(config: LlmConfig, shapes: RunShapes, mesh, args) -> dict:
  """Per-device bytes of one sampler call, by hand: the arguments (backbone, experts, prompts,
  with images their `vl.ImageRows`),
  the KV cache of all rows at full length (`cache_row_bytes`; rows over `data`) and, while the
  prefilled cache of one row per prompt is repeated M times, that cache too; and the prefill's
  transients: one chunk's layer activations and attention working set (one block of scores,
  `attention_bytes`) and the last-slot logits (f32).
  `rows_per_device`: at full length, how many rows fit one device of each chip beside the
  arguments and transients (the rest of a call's rows would wait for a free slot)."""
  rules = sharding_lib.ShardingRules()
  b = max(1, shapes.sample_rows // mesh.shape[rules.batch])
  slots = shapes.prompt_len + shapes.gen_len
  itemsize = np.dtype(args[0].embed.dtype).itemsize
  per_row = cache_row_bytes(config, slots, mesh, itemsize)
  prompts = max(1, b // shapes.group_size)
  repeat = shapes.group_size > 1
  cache_bytes = per_row * (b + (prompts if repeat else 0))
  w = LayerWidths.of(config, mesh)
  chunk = prefill_chunk(prompts, shapes.prompt_len)
  prefill = (prompts * chunk * layer_saved_bytes(w, itemsize)
             + attention_bytes(w, prompts, chunk, slots))
  logits = 4 * b * _split(config.vocab_size, mesh, rules.vocab)
  transients = prefill + logits
  images = image_rows(config, shapes, mesh, shapes.sample_rows, shapes.prompt_len,
                      args[0].embed.dtype)
  arguments = shard_bytes(args) + shard_bytes(images)
  return {"arguments": arguments, "cache": cache_bytes, "activations": transients,
          "total": arguments + cache_bytes + transients, "cache_per_row": per_row}


def with_tower_weights(estimate: dict, tower: dict) -> dict:
  """An update's or sampler's estimate with the frozen tower's weights held beside it."""
  return {**estimate, "tower_weights": tower["weights"],
          "total": estimate["total"] + tower["weights"]}


def rows_at_full_length(estimate: dict, chip_bytes: float, group_size: int = 1) -> int:
  """Sampler rows per device whose full-length cache fits `chip_bytes` beside the arguments and
  transients of `sample_estimate` (with M > 1, the prefilled rows' cache counts 1/M more)."""
  room = chip_bytes - estimate["arguments"] - estimate["activations"]
  per_row = estimate["cache_per_row"] * (1 + (1 / group_size if group_size > 1 else 0))
  return max(0, int(room // per_row))
