"""The APEx vision toy (issue 56 item 5): the committed text toy's language model behind a
Qwen2.5-VL vision tower, taught on this CPU to read the synthetic world's emblems and to run its
image questions.

  python -m apex_jax.toy.vision_train --steps=300 --out=/tmp/vt1 --log=LOG          # run 1
  python -m apex_jax.toy.vision_train --init=/tmp/vt1 --steps=200 --seed=1 --out=/tmp/vt2 \
      --log=LOG                                                                     # run 2
  python -m apex_jax.toy.vision_train --init=/tmp/vt2 --rows=reading --lr=0 --steps=300 \
      --batch=32 --buckets=128 --seed=2 --out=assets/toy_apex_vision --log=LOG      # run 3

(LOG: assets/toy_apex_vision_pretrain.log; docs/RESULTS.md, "The demo that sees", says what
each run taught and measured.)

The model (`assemble`): the text toy (`--init`, a Qwen3: q / k norms) with Qwen2.5-VL's vision
tokens added to its tokenizer and embedding (their rows start at the mean embedding), its rotary
split into Qwen2.5-VL's three streams (`mrope_section`: on text, where the streams are equal, the
same rotary as before), and a random tower (depth 2, hidden 64, merged to the language model's
192) in front. Qwen2.5-VL's own decoder is a Qwen2; a Qwen3 behind its tower is our pairing
(`llm.vl` reads it; transformers has no class for it), chosen so that the toy keeps everything the
text toy was taught instead of starting from scratch.

The rows (every weight trained, the tower at `--tower_lr`, the rest at `--lr`): on `--worlds`
worlds whose chain questions are half image questions (`datasets.world_images`), each image
question's reading drill, gold executor run and plan (`toy.vision_drills`), mixed with
`--text_share` times as many of the text toy's own conversations of the same worlds' text
versions (the corpus of its last run, `configs/toy/apex.py:12`'s settings), so that it keeps
them. Images at `--image_size` (16 language-model tokens at 112 px: the demo's bucket,
`model.image_size`). The log: the command, the corpus counts, the loss every 10 steps, at the start and
the end the held-out loss per kind of row and the share of reading rows with every caption
token right (teacher-forced), and at the end the greedy reading of the held-out world's emblems
(`reading_accuracy`: each attribute's word, whole captions; `--reading_only` prints it for
`--init`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from apex_jax.agents.config import AgentConfig
from apex_jax.agents.conversation import ChatDeltas
from apex_jax.agents.prompts import numbered
from apex_jax.agents.vl_generator import VlChatTokenizer
from apex_jax.datasets.world import World
from apex_jax.toy import build, encode, vision_drills
from apex_jax.toy.corpus import CorpusConfig
from apex_jax.tools import images as images_lib
from apex_jax.tools.overlap import WordSearch
from morse_jax import llm
from morse_jax.llm import model as llm_model
from morse_jax.llm import vision, vl

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
MROPE_SECTION = (8, 12, 12)  # Qwen2.5-VL's (16, 24, 24) halved: the toy's head_dim is 64
TOWER = vision.VisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                            out_hidden_size=192, fullatt_block_indexes=(1,))
IMAGES_PER_ROW = 4  # the question's image and 3 search results: every row's image slots
# the text toy's last corpus settings (configs/toy/apex.py run 12)
TEXT_CORPUS = dict(judge_share=0.1, align_share=0.1, distill_batches=8, reading_hops=3,
                   spaced_copies=True, context_share=0.7, context_negatives=2,
                   decoy_negatives=True)
KINDS = ("apex_see", "image_execute", "image_plan", "text")


def assemble(text_path: str, seed: int, tower: vision.VisionConfig = TOWER) -> vl.VlModel:
  """The text toy with the vision tokens and a random tower (module docstring)."""
  text = llm.load(text_path)
  hf = text.tokenizer.hf
  hf.add_tokens(list(VISION_TOKENS), special_tokens=True)
  ids = {t: hf.convert_tokens_to_ids(t) for t in VISION_TOKENS}
  vocab = len(hf)
  embed = text.params.embed
  grown = jnp.concatenate([embed, jnp.broadcast_to(embed.mean(0), (vocab - embed.shape[0],
                                                                   embed.shape[1]))])
  params = dataclasses.replace(text.params, embed=grown)
  if not text.config.tie_word_embeddings:
    raise ValueError(f"{text_path}: the toy's embedding must be tied to its output head")
  config = dataclasses.replace(text.config, vocab_size=vocab, mrope_section=MROPE_SECTION)
  if tower.out_hidden_size != config.hidden_size:
    tower = dataclasses.replace(tower, out_hidden_size=config.hidden_size)
  vl_config = vl.VlConfig(text=config, vision=tower, image_token_id=ids["<|image_pad|>"],
                          video_token_id=ids["<|video_pad|>"],
                          vision_start_token_id=ids["<|vision_start|>"],
                          vision_end_token_id=ids["<|vision_end|>"])
  towered = vision.init_random(tower, jax.random.key(seed))
  return vl.VlModel(config=vl_config, params=vl.VlParams(text=params, vision=towered),
                    tokenizer=llm.Tokenizer(hf, text.tokenizer.path), stop_ids=text.stop_ids)


def image_conversations(seed: int, entities: int, questions: int, config: AgentConfig,
                        rng: random.Random, plan_share: float = 0.5,
                        read_variant: int = 1, context_share: float = 0.7) -> list[dict]:
  """The reading drill on each entity's emblem (a search result's copy of it: read_variant; 0,
  the held-out world's: the question's own image), then the world's image questions as
  executor and plan conversations; context_share of the plans show the category's last two
  earlier image questions' memories, with captions (a text-image bank) or without, even odds."""
  world = World.generate(seed, entities, questions, image_share=0.5)
  searcher = WordSearch(world.passages, config.topk)
  out = readings(world, (read_variant,))
  earlier = collections.defaultdict(list)  # category -> its questions' gold runs so far
  for ex in (e for e in world.examples if e.images):
    plan = numbered(vision_drills.plan_steps(world, ex)) if rng.random() < plan_share else None
    run = vision_drills.executor_conversation(world, ex, searcher, config, plan, spaced=True)
    if run is None:
      continue
    out.append(run | {"kind": "image_execute"})
    shown = []
    if earlier[ex.category] and rng.random() < context_share:  # as the demo's bank: k = 2
      captions = rng.random() < 0.5
      shown = [vision_drills.memory_of(world, e, r, k, captions)
               for k, (e, r) in enumerate(earlier[ex.category][-2:], 1)]
    out.append(vision_drills.planner_conversation(world, ex, run["trace"], config, shown)
               | {"kind": "image_plan"})
    earlier[ex.category].append((ex, run))
  return out


def readings(world, variants) -> list[dict]:
  """The reading drill on every entity's emblem of `world`, each of `variants` of it."""
  return [vision_drills.reading_conversation(world, e, v) | {"kind": "apex_see"}
          for v in variants for e in world.entities]


def reading_conversations(seed: int, variants) -> list[dict]:
  """`readings` of world `seed` (the drills' worlds: 120 entities, 64 questions)."""
  return readings(World.generate(seed, 120, 64, image_share=0.5), variants)


def text_conversations(seeds, entities: int, questions: int, config: AgentConfig) -> list[dict]:
  turns, _ = build.corpus(seeds, entities, questions, config, CorpusConfig(**TEXT_CORPUS))
  return [t | {"kind": "text"} for t in turns]


@dataclasses.dataclass
class Row:
  tokens: np.ndarray
  mask: np.ndarray
  images: list  # recipes of the image blocks the tokens keep
  kind: str


def rows(conversations, tok: VlChatTokenizer, max_len: int, start_id: int) -> list[Row]:
  """Each conversation's encoded row (cut or dropped as `encode.examples` does), with the
  recipes of the image blocks it keeps."""
  out, deltas = [], ChatDeltas(tok)
  for c in conversations:
    got, _ = encode.example(c, tok, max_len, deltas)
    if got is None:
      continue
    tokens, mask = got
    shown = int((tokens == start_id).sum())
    out.append(Row(tokens, mask, list(c.get("images", ()))[:shown], c["kind"]))
  return out


class Pixels:
  """Rendered, resized and patchified images by recipe (cached: recipes repeat each epoch)."""

  def __init__(self, config: vision.VisionConfig, size: int):
    self.config, self.size, self.cache = config, size, {}
    blank = np.zeros((size, size, 3), np.uint8)
    self.blank, self.grid = vision.patchify(vision.normalize(blank), config)

  def __call__(self, recipe) -> np.ndarray:
    key = tuple(recipe)
    if key not in self.cache:
      image = vision_drills.render_images([recipe])[0]
      self.cache[key] = vision.patchify(vision.normalize(images_lib.resized(image, self.size)),
                                        self.config)[0]
    return self.cache[key]


def batch_arrays(batch: list[Row], length: int, size: int, config: vl.VlConfig, pixels: Pixels,
                 pad_id: int) -> dict:
  """Right-padded tokens, masks, every row's IMAGES_PER_ROW images (blanks after its own),
  the image slots and rotary streams of the pads."""
  b = len(batch)
  tokens = np.full((b, length), pad_id, np.int32)
  mask = np.zeros((b, length), np.float32)
  attn = np.zeros((b, length), np.int32)
  images, grids = [], []
  for i, r in enumerate(batch):
    tokens[i, :len(r.tokens)], mask[i, :len(r.tokens)], attn[i, :len(r.tokens)] = \
        r.tokens, r.mask, 1
    own = [pixels(x) for x in r.images]
    images += own + [pixels.blank] * (IMAGES_PER_ROW - len(own))
    grids += [pixels.grid] * len(own)
  positions, _ = vl.rope_index(tokens, config, grids, attn)
  is_image = tokens == config.image_token_id
  index = np.where(is_image, np.cumsum(is_image, axis=1) - 1, -1).astype(np.int32)
  return {"tokens": tokens, "mask": mask, "attn": attn, "pixels": np.concatenate(images),
          "index": index, "positions": np.moveaxis(positions, 0, 1).astype(np.int32)}


def loss_sums(params: vl.VlParams, config: vl.VlConfig, grid, batch):
  """(summed next-token loss over masked targets [b], target count [b], argmax hits [b, t-1])."""
  b = batch["tokens"].shape[0]
  features = vision.tower(params.vision, config.vision, batch["pixels"],
                          (grid,) * (b * IMAGES_PER_ROW))
  images = vl.ImageRows(features=features.reshape(b, -1, features.shape[-1]),
                        index=batch["index"], positions=batch["positions"])
  logits, _ = llm_model.forward(params.text, config.text, batch["tokens"],
                                positions=images.streams, attention_mask=batch["attn"],
                                embeds=vl.embed_rows(params.text.embed, batch["tokens"], images))
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  target, m = batch["tokens"][:, 1:], batch["mask"][:, 1:]
  nll = -jnp.take_along_axis(logp, target[..., None], -1)[..., 0]
  hits = (jnp.argmax(logp, -1) == target).astype(jnp.float32) * m
  return jnp.sum(nll * m, 1), jnp.sum(m, 1), hits


def optimizer(steps: int, lr: float, tower_lr: float):
  def schedule(peak):
    return optax.warmup_cosine_decay_schedule(0.0, peak, min(10, steps - 1), steps, peak * 0.1)

  labels = lambda p: vl.VlParams(text=jax.tree.map(lambda _: "text", p.text),
                                 vision=jax.tree.map(lambda _: "vision", p.vision))
  return optax.chain(optax.clip_by_global_norm(1.0), optax.multi_transform(
      {"text": optax.set_to_zero() if lr == 0 else  # --lr=0: the language model frozen
               optax.adamw(schedule(lr), b1=0.9, b2=0.95, weight_decay=0.0),
       "vision": optax.adamw(schedule(tower_lr), b1=0.9, b2=0.95, weight_decay=0.0)}, labels))


def buckets_of(data: list[Row], buckets) -> dict[int, list[Row]]:
  out = collections.defaultdict(list)
  for r in data:
    out[next(b for b in buckets if len(r.tokens) <= b)].append(r)
  return out


def evaluate(params, config, grid, data: list[Row], buckets, batch, size, pixels, pad_id, loss_jit):
  """Held-out loss per kind, and the reading rows' share with every caption token right."""
  sums, counts, right, reads = collections.Counter(), collections.Counter(), 0, 0
  for length, group in sorted(buckets_of(data, buckets).items()):
    for i in range(0, len(group), batch):
      part = group[i:i + batch]
      part = part + [part[-1]] * (batch - len(part))  # a full batch: one compiled shape
      arrays = batch_arrays(part, length, size, config, pixels, pad_id)
      nll, n, hits = jax.device_get(loss_jit(params, arrays))
      for k, r in enumerate(group[i:i + batch]):
        sums[r.kind] += float(nll[k])
        counts[r.kind] += float(n[k])
        if r.kind == "apex_see":
          reads += 1
          right += int(hits[k].sum() == n[k])
  out = {f"held_out_loss_{k}": round(sums[k] / counts[k], 4) for k in KINDS if counts[k]}
  out["captions_right"] = round(right / max(reads, 1), 4)
  return out


# the caption's word of each attribute: "a {colour} {shape} emblem with {count} {ink} {marks}
# on a {field} field" (a two-word field's first word)
ATTRIBUTE_WORDS = {"colour": 1, "shape": 2, "count": 5, "marks": 7, "field": 10}


def reading_accuracy(model: vl.VlModel, seed: int, size: int, batch: int = 40,
                     steps: int = 40) -> dict:
  """Greedy captions of every entity's emblem (the question's image, variant 0) of world
  `seed`: the share with each attribute's word right and with every word right."""
  tok = VlChatTokenizer(model.tokenizer, image_size=size)
  pixels = Pixels(model.config.vision, size)
  convs = reading_conversations(seed, (0,))
  prompt = tok.apply_chat_template(convs[0]["messages"], images=1)
  said = []
  for i in range(0, len(convs), batch):
    part = convs[i:i + batch]
    out = vl.greedy(model.params, model.config, np.asarray([prompt] * len(part), np.int32),
                    np.concatenate([pixels(c["images"][0]) for c in part]),
                    [pixels.grid] * len(part), steps=steps)
    for row in out.tolist():  # up to the first stop id
      end = min([row.index(s) for s in model.stop_ids if s in row], default=len(row))
      said.append(model.tokenizer.decode(row[:end]))
  want = [c["target"].split() for c in convs]
  got = [s.split() for s in said]
  out = {name: round(float(np.mean([len(g) > j and g[j] == w[j] for g, w in zip(got, want)])), 4)
         for name, j in ATTRIBUTE_WORDS.items()}
  out["captions_right"] = round(float(np.mean([g == w for g, w in zip(got, want)])), 4)
  return out


def main(argv):
  del argv
  F = flags.FLAGS
  if F.steps < 2:
    raise app.UsageError(f"--steps must be at least 2; got {F.steps}")
  start = time.time()
  # a VL folder (an earlier run of this program): continued as it is; else the text toy
  model = vl.load(F.init) if vl.is_vl_folder(F.init) else assemble(F.init, F.seed)
  if F.reading_only:  # the greedy reading of the held-out world's emblems, no training
    print(json.dumps({"init": F.init, "held_out_world": F.world_seed + 100000, "greedy_reading":
                      reading_accuracy(model, F.world_seed + 100000, F.image_size)}), flush=True)
    return
  config = model.config
  tok = VlChatTokenizer(model.tokenizer, image_size=F.image_size)
  agent = AgentConfig(prompts="compact", topk=2)
  rng = random.Random(F.seed)
  train_seeds = [F.world_seed + i for i in range(F.worlds)]
  held_seed = F.world_seed + 100000
  if F.rows == "reading":  # the reading drill alone: every emblem's 4 search-result copies
    images, keep = [c for s in train_seeds for c in reading_conversations(s, range(1, 5))], []
    held, held_text = reading_conversations(held_seed, (0,)), []
  else:
    images = [c for s in train_seeds for c in image_conversations(s, 120, 64, agent, rng)]
    text = text_conversations(train_seeds, 120, 64, agent)
    keep = rng.sample(text, min(len(text), int(F.text_share * len(images))))
    held = image_conversations(held_seed, 120, 64, agent, random.Random(held_seed),
                               read_variant=0)
    held_text = text_conversations([held_seed], 120, 64, agent)[:64]
  buckets = tuple(F.buckets)
  start_id = config.vision_start_token_id
  train = rows(images + keep, tok, max(buckets), start_id)
  held_rows = rows(held + held_text, tok, max(buckets), start_id)
  pixels = Pixels(config.vision, F.image_size)
  grid = pixels.grid
  pad_id = model.tokenizer.pad_id
  log = open(F.log, "a") if F.log else None

  def record(entry):
    print(json.dumps(entry), flush=True)
    if log:
      log.write(json.dumps(entry) + "\n")
      log.flush()

  record({"command": "python -m apex_jax.toy.vision_train", "init": F.init, "out": F.out,
          "steps": F.steps, "batch": F.batch, "lr": F.lr, "tower_lr": F.tower_lr,
          "image_size": F.image_size, "worlds": train_seeds, "held_out_world": held_seed,
          "text_share": F.text_share, "rows_kind": F.rows, "seed": F.seed,
          "rows": dict(collections.Counter(r.kind for r in train)),
          "held_out_rows": dict(collections.Counter(r.kind for r in held_rows)),
          "params_language_model": config.text.num_params(),
          "setup_seconds": round(time.time() - start, 1)})
  opt = optimizer(F.steps, F.lr, F.tower_lr)
  params = model.params
  state = opt.init(params)

  def mean_loss(p, arrays):
    nll, n, _ = loss_sums(p, config, grid, arrays)
    return jnp.sum(nll) / jnp.maximum(jnp.sum(n), 1.0)

  @jax.jit
  def step(p, s, arrays):
    loss, grads = jax.value_and_grad(mean_loss)(p, arrays)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

  loss_jit = jax.jit(lambda p, arrays: loss_sums(p, config, grid, arrays))
  record({"step": 0, **evaluate(params, config, grid, held_rows, buckets, F.batch,
                                F.image_size, pixels, pad_id, loss_jit),
          "seconds": round(time.time() - start, 1)})
  groups = buckets_of(train, buckets)
  weights = np.asarray([len(g) for g in groups.values()], np.float64)
  lengths = list(groups)
  draw = np.random.default_rng(F.seed)
  window = []
  for i in range(1, F.steps + 1):
    length = lengths[draw.choice(len(lengths), p=weights / weights.sum())]
    group = groups[length]
    part = [group[j] for j in draw.choice(len(group), min(F.batch, len(group)), replace=False)]
    part += [part[-1]] * (F.batch - len(part))
    arrays = batch_arrays(part, length, F.image_size, config, pixels, pad_id)
    params, state, loss = step(params, state, arrays)
    window.append(loss)
    if i % 10 == 0 or i == F.steps:
      record({"step": i, "train_loss": round(float(np.mean(jax.device_get(window))), 4),
              "seconds": round(time.time() - start, 1)})
      window = []
  record({"step": F.steps, **evaluate(params, config, grid, held_rows, buckets, F.batch,
                                      F.image_size, pixels, pad_id, loss_jit),
          "seconds": round(time.time() - start, 1)})
  model = dataclasses.replace(model, params=params)
  record({"step": F.steps, "greedy_reading": reading_accuracy(model, held_seed, F.image_size),
          "seconds": round(time.time() - start, 1)})
  vl.save(model, F.out)
  record({"saved": F.out, "seconds": round(time.time() - start, 1)})


def define_flags() -> None:
  """Flags defined when run as a program (tests import this module beside launchers)."""
  flags.DEFINE_string("init", "assets/toy_apex", "The text toy folder (or a vision toy's, to "
                      "continue it).")
  flags.DEFINE_string("out", "assets/toy_apex_vision", "Where the VL toy's folder is written.")
  flags.DEFINE_integer("steps", 200, "Optimiser steps.")
  flags.DEFINE_integer("batch", 16, "Rows per step.")
  flags.DEFINE_float("lr", 5e-4, "Language model learning rate (peak; warmup 10, cosine).")
  flags.DEFINE_float("tower_lr", 2e-3, "Vision tower learning rate (peak).")
  flags.DEFINE_integer("image_size", 112, "Image side in px (a multiple of 28).")
  flags.DEFINE_integer("worlds", 8, "Training worlds (seeds world_seed + i).")
  flags.DEFINE_integer("world_seed", 5000, "The first training world's seed.")
  flags.DEFINE_float("text_share", 1.0, "Text conversations per image conversation.")
  flags.DEFINE_multi_integer("buckets", [384, 640, 1024, 1536], "Row length buckets.")
  flags.DEFINE_integer("seed", 0, "Tower, sampling and batch seed.")
  flags.DEFINE_string("log", None, "Append the run's JSON lines to this file.")
  flags.DEFINE_enum("rows", "all", ["all", "reading"], "all: the drills and the text toy's "
                    "conversations; reading: the reading drill alone (4 copies of each emblem).")
  flags.DEFINE_bool("reading_only", False, "Only print --init's greedy reading of the held-out "
                    "world's emblems.")


if __name__ == "__main__":
  define_flags()
  app.run(main)
