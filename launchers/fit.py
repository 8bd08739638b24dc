"""Does a run fit in accelerator memory? The update step and the sampler compiled ahead of time on
8 fake CPU devices at the config's real shapes and batch, with per-device bytes against common
accelerators.

  python -m launchers.fit --config=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,gpu8
  python -m launchers.fit --config=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,tpu_v5e8 \
      --config.train.step.micro_batches=2 --config.train.step.remat=False   # another layout
  python -m launchers.fit --config=configs/apex/paper.py --stage=planner   # or executor,
      distiller, ttrl; the paper config's mesh (4x2) and the stage's micro-batches
  python -m launchers.fit --config=configs/apex/paper.py --stage=executor  # on the Qwen2.5-VL
      executor (config.executor_model): rows with images, the frozen tower beside, its own pass

Shapes (morse_jax.rl.aot.RunShapes): one update of `--nodes` nodes (default: the tasks of a
batch, one node each) x B routes x M candidates, prompts of `--prompt_tokens`, the config's
generation budget and micro-batches. The backbone comes from config.model.path's config.json
when there is one, else from llm.presets.ARCHITECTURES by config.model.name (or `--model`).
Nothing is allocated; compiling an 8B update takes a few minutes of CPU and ~1 GB of RAM.

XLA:CPU's buffer assignment is not the TPU's or GPU's (other fusions and schedules, and f32
copies where CPU has no bf16 dot), so the compiled bytes are an estimate; the analytical bytes
(arguments exactly, activations by formula) stand beside them.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launchers.fit_plan import ACCELERATORS, GIB, fits, plan  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_PROMPT = flags.DEFINE_integer("prompt_tokens", 2048, "tokens of a node's (or query's) prompt")
_NODES = flags.DEFINE_integer("nodes", 0, "nodes per update (0: config.train.tasks_per_step)")
_MODEL = flags.DEFINE_string("model", "", "architecture name in llm.presets.ARCHITECTURES "
                             "(default: config.model.name; APEx: Qwen3-8B)")
_STAGE = flags.DEFINE_string("stage", "planner", "APEx: the stage whose batch is measured: a key "
                             "of config.stages, or ttrl (config.ttrl)")
_MESH = flags.DEFINE_string("mesh", "", "DATAxMODEL (default: config.mesh; else 8x1)")
_COMPILE = flags.DEFINE_bool("compile", True, "False: the analytical bytes only")
_OUT = flags.DEFINE_string("out", "", "a JSON file to add this run's entry to")
_NAME = flags.DEFINE_string("name", "", "the entry's name in --out (default: from the config)")

def _fits_text(total_bytes: float) -> str:
  return "  ".join(f"{label} {'fits' if ok else 'NO'}" for label, ok in fits(total_bytes).items())


def _row(label: str, numbers: dict) -> str:
  cells = "  ".join(f"{k} {v / GIB:.2f}" for k, v in numbers.items())
  return f"  {label:<19} {cells}"


def main(argv):
  del argv
  import jax

  from morse_jax.llm import sharding
  from morse_jax.experiments.pipeline import banner
  from morse_jax.rl import aot

  config = _CONFIG.value
  apex = config.get("system") == "apex"
  name, model, lora, router, step, shapes, (data, model_axis), vision = plan(
      config, stage=_STAGE.value, prompt_tokens=_PROMPT.value, nodes=_NODES.value,
      model=_MODEL.value, mesh=_MESH.value)
  if data * model_axis != 8:
    raise app.UsageError(f"mesh {data}x{model_axis}: this check runs on 8 fake devices")
  remat = getattr(step, "remat", False)
  banner("shapes")
  print(f"model {name}: {model.num_params() / 1e9:.2f}B parameters; mesh data {data} x model "
        f"{model_axis}; micro-batches {shapes.micro_batches}; remat {remat}")
  layout = (f"shared prompts: {shapes.packed_rows} packed rows x {shapes.packed_width} slots"
            if shapes.shared else f"{shapes.rows} rows x {shapes.width} tokens")
  print(f"update: {shapes.rows} rows ({shapes.nodes} nodes x B {shapes.routes_per_node} x M "
        f"{shapes.group_size}), {layout}")
  print(f"sampler: {shapes.sample_rows} rows, prompt {shapes.prompt_len} + generation "
        f"{shapes.gen_len} slots, each prompt prefilled once per {shapes.group_size} rows")
  tower_images = shapes.sample_rows // data * shapes.images
  if vision is not None:
    print(f"images: {shapes.images} per row of {shapes.image_tokens} tokens (in the prompt); "
          f"the frozen tower over a sampler call's {tower_images} per device")
  amesh = aot.abstract_mesh(data, model_axis)
  update_args, update_kwargs = aot.update_args(model, lora, router, step, shapes, amesh)
  sample_args, sample_kwargs = aot.sample_args(model, lora, shapes, amesh)
  programs = {
      "update": (aot.train_step_fn(), update_args, update_kwargs,
                 aot.update_estimate(model, shapes, amesh, update_args, remat=remat)),
      "sampler": (aot.sampler_fn(), sample_args, sample_kwargs,
                  aot.sample_estimate(model, shapes, amesh, sample_args))}
  if vision is not None:  # the tower's weights beside each program, and the tower's own pass
    tower_args, tower_kwargs = aot.tower_args(vision, tower_images, amesh)
    tower = aot.tower_estimate(vision, tower_args)
    programs = {k: (*v[:3], aot.with_tower_weights(v[3], tower)) for k, v in programs.items()}
    programs["tower"] = (aot.tower_fn(), tower_args, tower_kwargs, tower)
  result = {"model": name, "params_b": model.num_params() / 1e9, "mesh": [data, model_axis],
            "micro_batches": shapes.micro_batches, "remat": remat,
            "prompt_tokens": shapes.prompt_tokens, "max_new_tokens": shapes.max_new_tokens,
            "update_rows": shapes.rows, "sample_rows": shapes.sample_rows,
            "shared_prompts": shapes.shared, "images_per_row": shapes.images,
            "devices": jax.device_count(),
            "backend": jax.default_backend(), "programs": {}}
  mesh = sharding.make_mesh(data, model_axis) if _COMPILE.value else None
  banner("per-device GiB")
  for program, (fn, args, kwargs, estimate) in programs.items():
    entry = {"analytical": estimate}
    print(f"{program}:")
    print(_row("analytical", estimate))
    print(f"  {'':<19} {_fits_text(estimate['total'])}")
    if mesh is not None:
      compiled = aot.memory(fn, args, kwargs, mesh)
      nearer = compiled["peak"] - compiled["cpu_f32_copies"]
      entry["compiled_cpu"] = compiled
      entry["fits"] = fits(nearer)
      print(_row("compiled (XLA:CPU)", compiled))
      print(f"  {'':<19} peak - cpu_f32_copies {nearer / GIB:.2f}: {_fits_text(nearer)}")
    if program == "sampler":
      entry["rows_at_full_length"] = {
          label: aot.rows_at_full_length(estimate, gib * GIB, shapes.group_size)
          for label, gib in ACCELERATORS}
      print(f"  {'':<19} rows per device at full length ({shapes.prompt_len + shapes.gen_len} "
            f"slots, {estimate['cache_per_row'] / GIB:.2f} GiB of cache each; "
            f"{-(-shapes.sample_rows // data)} in this call): "
            + "  ".join(f"{k} {v}" for k, v in entry["rows_at_full_length"].items()))
    result["programs"][program] = entry
  print("compiled: XLA:CPU's buffer assignment on fake devices, not the TPU / GPU one (other "
        "fusions and schedules; f32 copies of bf16 weights, counted in cpu_f32_copies, where "
        "CPU has no bf16 dot); peak = argument + output - alias + temp. Chips: "
        + ", ".join(f"{k} {v} GiB" for k, v in ACCELERATORS))
  if _OUT.value:
    entries = {}
    if os.path.exists(_OUT.value):
      with open(_OUT.value) as f:
        entries = json.load(f)
    key = _NAME.value or f"{'apex ' + _STAGE.value if apex else 'morse'} {name} {data}x{model_axis}"
    entries[key] = result
    with open(_OUT.value, "w") as f:
      json.dump(entries, f, indent=2, sort_keys=True)
    print(f"wrote {_OUT.value} [{key!r}]")


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
