#!/bin/bash
# Trains the same small runs with two checkouts of hfl and compares each pair with
# bench/same_results.py: one run per sync strategy family (sync, periodic, semi_sync,
# progress-aware, adacomm, FedNova weights, an outage, Streaming DiLoCo with and without
# overlap, SCAFFOLD) and one per compressor family of the registry (top-k, rand-k,
# QSGD, sign, CO3, e3m0, PowerSGD, float16, bfloat16, chunked top-k, DCT top-k) on
# configs/smoke.py, and the default run (configs/default.py, real
# Fashion-MNIST, about a minute on 2 cores).
#
#   bash bench/same_results_runs.sh OLD_CHECKOUT NEW_CHECKOUT FASHION_MNIST_DIR [OUT]
#
# OLD_CHECKOUT, NEW_CHECKOUT: directories holding hfl (e.g. `git worktree add /tmp/old
# <commit>`); FASHION_MNIST_DIR: the IDX files the smoke runs train on (any Fashion-MNIST
# copy, or tests.helpers.make_fake_fashion_mnist's). Prints each pair's differences; a
# config field added between the two checkouts shows as `config.<field>: None != value`.
set -u
OLD=$1 NEW=$2 DATA=$3 OUT=${4:-/tmp/same_results_runs}
mkdir -p "$OUT"
RUNS=(
  "periodic|"
  "sync|--config.sync.strategy=sync"
  "semi|--config.sync.strategy=semi_sync --config.network.dc_speed=(3.0,1.0)"
  "pa|--config.sync.strategy=semi_sync --config.sync.progress_aware=True --config.network.dc_speed=(3.0,1.0)"
  "adacomm|--config.sync.strategy=adacomm"
  "fednova|--config.sync.strategy=semi_sync --config.sync.aggregation=fednova --config.network.dc_speed=(3.0,1.0)"
  "faults|--config.sync.faults=1:2-3"
  "stream|--config.sync.fragments=2 --config.sync.k=4 --config.compression.broadcast=gather"
  "overlap|--config.sync.fragments=2 --config.sync.k=4 --config.sync.overlap_steps=1 --config.compression.broadcast=gather"
  "scaffold|--config.sync.control_variates=scaffold"
  # One run per compressor family (uplink, downlink with the round's update through it, WAN).
  "topk|--config.compression.uplink.name=topk --config.compression.uplink.density=0.05 --config.compression.downlink.name=topk --config.compression.downlink.density=0.05"
  "randk_bf16|--config.compression.uplink.name=randk --config.compression.uplink.density=0.1 --config.compression.wan.name=bf16"
  "qsgd_sign|--config.compression.uplink.name=qsgd --config.compression.wan.name=sign"
  "co3|--config.compression.uplink.name=co3 --config.compression.wan.name=e3m0"
  "powersgd_fp16|--config.compression.uplink.name=powersgd --config.compression.downlink.name=fp16"
  "chunked_dct|--config.compression.uplink.name=chunked_topk --config.compression.uplink.density=0.05 --config.compression.wan.name=dct_topk --config.compression.wan.density=0.05"
)
for side in old new; do
  tree=$OLD; [ $side = new ] && tree=$NEW
  for r in "${RUNS[@]}"; do
    name=${r%%|*}; args=${r#*|}
    rm -rf "$OUT/$side/$name"
    (cd "$tree" && python3 main.py --config=configs/smoke.py --workdir="$OUT/$side/$name" \
        --config.dataset.data_dir="$DATA" $args > "$OUT/$side.$name.log" 2>&1) ||
      echo "$side $name failed: $OUT/$side.$name.log"
  done
  rm -rf "$OUT/$side/default"
  (cd "$tree" && python3 main.py --config=configs/default.py --workdir="$OUT/$side/default" \
      > "$OUT/$side.default.log" 2>&1) || echo "$side default failed: $OUT/$side.default.log"
done
for r in "${RUNS[@]}" "default|"; do
  name=${r%%|*}
  echo "== $name"
  python3 "$(dirname "$0")/same_results.py" "$OUT/old/$name" "$OUT/new/$name"
done
