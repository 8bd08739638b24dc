#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: the same command runs on every worker; JAX finds the slice's
# coordinator by itself (--config.distributed.auto=True).
#
#   TPU=my-v5e-8 ZONE=us-west4-a CONFIG=configs/morse/scicode.py:mole_hgrpo,qwen3_4b,tpu_v5e8 \
#   MODEL=/mnt/ckpt/Qwen3-4B-Instruct-2507 DATA=/mnt/data/scicode.json \
#   WORKDIR=/mnt/runs/scicode_hgrpo launchers/cluster/tpu_vm.sh
#
# The repo, the checkpoint and the data must be at the same paths on every worker (a shared
# disk, or copy them first); WORKDIR should be shared (e.g. a gcsfuse mount) for checkpoints.
set -euo pipefail
: "${TPU:?name of the TPU VM}" "${ZONE:?zone}" "${CONFIG:?config file:arg}" "${MODEL:?}" \
  "${DATA:?}" "${WORKDIR:?}"
REPO=${REPO:-~/morse-jax}
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "
  set -e; cd $REPO
  [ -x .venv/bin/python ] || { make venv && .venv/bin/pip install -U 'jax[tpu]'; }
  .venv/bin/python -m launchers.train --config=$CONFIG --config.model.path=$MODEL \
      --config.task.path=$DATA --config.workdir=$WORKDIR --config.distributed.auto=True
"
