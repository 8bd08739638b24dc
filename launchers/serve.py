"""Serve a model folder as an OpenAI-compatible chat server (for the APEx judges, or any client).

  python -m launchers.serve --model=assets/toy_qwen3 [--host=127.0.0.1 --port=8000 --max_batch=64]
  curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 16, "temperature": 0}'

Any folder `morse_jax.llm.load` reads works (safetensors + config.json + a tokenizer with a chat
template). Requests queued together are merged into one sampler call. Judges connect with
`apex_jax.judges.ChatClient("http://127.0.0.1:8000", model=...)`. LoRA routes are served by
`apex_jax.judges.InProcessChat(adapter_route=...)` in process only, not by this server.
Stop with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", None, "Model folder (Hugging Face layout).", required=True)
_NAME = flags.DEFINE_string("served_model_name", None, "Name in replies and /v1/models "
                            "(default: the folder's name).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: all interfaces).")
_PORT = flags.DEFINE_integer("port", 8000, "Port (0: any free port).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 64, "Most rows merged into one sampler call.")
_MAX_TOKENS = flags.DEFINE_integer("default_max_tokens", 512, "max_tokens when a request has none.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                           "Weight dtype (default: the checkpoint's).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Log every request.")


def main(argv):
  del argv
  from apex_jax.judges import InProcessChat, serving
  from morse_jax import llm
  from morse_jax.mas.pipeline import banner

  banner("load model")
  model = llm.load(_MODEL.value, dtype=_DTYPE.value)
  name = _NAME.value or os.path.basename(os.path.normpath(_MODEL.value))
  print(f"{_MODEL.value}: {model.config.num_layers} layers, vocab {model.config.vocab_size}")
  chat = InProcessChat(model, seed=_SEED.value)
  srv = serving.make_server(chat, name, _HOST.value, _PORT.value, max_batch=_MAX_BATCH.value,
                            default_max_tokens=_MAX_TOKENS.value, verbose=_VERBOSE.value)
  banner(f"serving {name} at {srv.url}/v1")

  def stop(signum, frame):  # SIGTERM (kill, cluster schedulers) ends the server as Ctrl-C does
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, stop)
  try:
    srv.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    srv.server_close()
    print(f"served {srv.requests} requests ({srv.errors} errors) in {srv.batcher.calls} "
          f"sampler calls", flush=True)


if __name__ == "__main__":
  app.run(main)
