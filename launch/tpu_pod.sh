#!/usr/bin/env bash
# Runs one hfl experiment on every host of a Cloud TPU VM pod slice or multi-slice.
#
#   launch/tpu_pod.sh TPU_NAME ZONE [PROJECT] -- --config=configs/default.py \
#       --workdir=/mnt/shared/hfl/run1 [--config.sync.k=8 ...]
#
# One process per TPU VM host (`gcloud compute tpu-vm ssh --worker=all`); JAX
# detects the pod by itself (hfl.distributed.maybe_initialize -> JAX's cluster
# detection), so no coordinator flags are needed. On multi-slice (several slices
# joined over DCN), 'dc' spans slices and 'worker' stays on one slice's ICI
# (mesh_utils.create_hybrid_device_mesh in hfl/mesh.py); mesh.num_dcs must be a
# multiple of the number of processes and num_dcs * workers_per_dc the number of
# chips. The workdir must be a path every host sees (an NFS/Filestore mount, or a
# gs:// bucket mounted with gcsfuse: metrics are written with plain open(), see
# docs/multihost.md): all hosts write their checkpoint shards there.
#
# Environment: HFL_REPO (checkout path on the VMs, default ~/hfl; it must already
# hold this repository and its requirements), HFL_INIT_TIMEOUT_S (start-up bound).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,17p' "$0"; exit 2
fi
TPU_NAME=$1; ZONE=$2; shift 2
PROJECT_ARGS=()
if [[ $1 != -- ]]; then PROJECT_ARGS=(--project="$1"); shift; fi
[[ ${1:-} == -- ]] && shift
REPO=${HFL_REPO:-'~/hfl'}
ARGS=$(printf '%q ' "$@")
exec gcloud compute tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_ARGS[@]}" --worker=all \
  --command="cd $REPO && HFL_INIT_TIMEOUT_S=${HFL_INIT_TIMEOUT_S:-300} python3 main.py $ARGS 2>&1 | tee -a /tmp/hfl_\$(hostname).log; exit \${PIPESTATUS[0]}"
