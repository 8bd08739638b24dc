"""Serve a model folder as an OpenAI-compatible chat server (for the APEx judges, or any client).

  python -m launchers.serve --model=assets/toy_qwen3 [--host=127.0.0.1 --port=8000 --max_batch=64]
  curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 16, "temperature": 0}'
  # also /v1/completions ({"prompt": ...}), /v1/models, and "stream": true (server-sent events);
  # the official client works: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")

Any folder `morse_jax.llm.load` reads works (safetensors + config.json + a tokenizer with a chat
template); a Qwen2.5-VL folder (model_type qwen2_5_vl) also takes OpenAI `image_url` parts with
base64 data URLs (each resized to 448 x 448; other URLs refused, never fetched). On one device requests are generated on the engine (continuous batching: each
enters a free slot between steps and is answered when its own tokens are done; --max_batch
slots, --step_tokens per row per step, --cache_tokens of KV per route). Judges connect with
`apex_jax.judges.ChatClient("http://127.0.0.1:8000", model=...)`.

LoRA adapters (PEFT folders: what `morse_jax.lora.export.export_peft` writes for a trained route,
or peft's save_pretrained) are served next to the base model, as vLLM's --lora-modules are:

  python -m launchers.serve --model=assets/toy_qwen3 --lora_modules=executor=/tmp/executor_lora
  # a request with "model": "executor" runs through that adapter; any other name: the base model
Stop with Ctrl-C or SIGTERM (graceful: no new connections, queued requests answered, the
generating thread joined, exit 0). Every `ChatLimits` field is a flag (--max_body_bytes,
--max_connections, --read_timeout_s, --max_incomplete, --max_incomplete_per_address, --max_queue,
--max_prompt_chars, --max_tokens, --max_n, --step_tokens, --cache_tokens, ...).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "Model folder (Hugging Face layout).", required=True)
_NAME = flags.DEFINE_string("served_model_name", None, "Name in replies and /v1/models "
                            "(default: the folder's name).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: all interfaces).")
_PORT = flags.DEFINE_integer("port", 8000, "Port (0: any free port).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 64, "Rows generated at once (engine slots).")
_MAX_TOKENS = flags.DEFINE_integer("default_max_tokens", 512, "max_tokens when a request has none.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                           "Weight dtype (default: the checkpoint's).")
_LORA = flags.DEFINE_list("lora_modules", [], "name=PEFT_DIR pairs: adapters served under their "
                          "names on the same backbone.")
from apex_jax.judges.protocol import ChatLimits  # noqa: E402
from morse_jax.serving.http import define_limit_flags  # noqa: E402

_LIMITS = define_limit_flags(ChatLimits, skip=("max_batch",))
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Log every request.")


def adapter_chats(model, specs, seed: int) -> dict:
  """{name: InProcessChat through the PEFT adapter} of `name=DIR` specs."""
  from apex_jax.judges import InProcessChat
  from apex_jax.judges.inprocess import AdapterRoute
  from morse_jax.lora.export import import_peft

  out = {}
  for spec in specs:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
      raise app.UsageError(f"--lora_modules entry {spec!r} must be name=PEFT_DIR")
    if name in out:
      raise app.UsageError(f"--lora_modules names {name!r} twice")
    experts, lora = import_peft(path, model.config)
    out[name] = InProcessChat(model, AdapterRoute(experts, lora, (0,)), seed=seed)
  return out


def build_server(model_dir: str, *, served_model_name: str | None = None, dtype: str | None = None,
                 lora_modules=(), seed: int = 0, host: str = "127.0.0.1", port: int = 8000,
                 max_batch: int = 64, default_max_tokens: int = 512, verbose: bool = False,
                 limits=None):
  """The bound chat server `main` serves (what tests start in-process): the model folder, its
  adapters, `serving.make_server`."""
  import jax.numpy as jnp

  from apex_jax.judges import InProcessChat, serving
  from apex_jax.judges.protocol import ChatLimits
  from launchers.generate_lib import is_vl_folder
  from morse_jax import llm
  from morse_jax.llm import vl

  vision = is_vl_folder(model_dir)
  if vision and lora_modules:
    raise app.UsageError("--lora_modules: adapters on a Qwen2.5-VL folder are not served yet")
  model = (vl.load(model_dir, dtype=jnp.dtype(dtype or "float32")) if vision
           else llm.load(model_dir, dtype=dtype))
  name = served_model_name or os.path.basename(os.path.normpath(model_dir))
  text = model.config.text if vision else model.config
  print(f"{model_dir}: {text.num_layers} layers, vocab {text.vocab_size}"
        + (", Qwen2.5-VL: image_url parts taken" if vision else ""))
  chat = InProcessChat(model, seed=seed)
  adapters = adapter_chats(model, lora_modules, seed)
  limits = limits or ChatLimits(max_batch=max_batch)
  for adapter in adapters:
    print(f"adapter {adapter}: {adapters[adapter].route.lora}")
  return serving.make_server(chat, name, host, port, max_batch=max_batch,
                             default_max_tokens=default_max_tokens, verbose=verbose,
                             adapters=adapters, limits=limits)


def main(argv):
  del argv
  from morse_jax.serving.http import serve_until_stopped
  from morse_jax.experiments.pipeline import banner

  banner("load model")
  srv = build_server(_MODEL.value, served_model_name=_NAME.value, dtype=_DTYPE.value,
                     lora_modules=_LORA.value, seed=_SEED.value, host=_HOST.value,
                     port=_PORT.value, max_batch=_MAX_BATCH.value,
                     default_max_tokens=_MAX_TOKENS.value, verbose=_VERBOSE.value,
                     limits=_LIMITS(max_batch=_MAX_BATCH.value))
  banner(f"serving {srv.model_name} at {srv.url}/v1")

  try:
    serve_until_stopped(srv)
  finally:
    print(f"served {srv.requests} requests ({srv.errors} errors) in {srv.batcher.calls} "
          f"{'engine steps' if srv.batcher.thread_name == 'chat-engine' else 'sampler calls'}",
          flush=True)


if __name__ == "__main__":
  app.run(main)
