#!/usr/bin/env bash
# Installs what hfl needs on a fresh Debian/Ubuntu machine; safe to rerun (idempotent).
#   - Python packages pinned in requirements.txt (pip);
#   - Fashion-MNIST IDX files from Debian's dataset-fashion-mnist package
#     (/usr/share/datasets/fashion-mnist), the default dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements.txt

FMNIST=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ ! -f "$FMNIST" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1) || {
      apt-get update -qq >/dev/null && apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
      || echo "warning: could not install dataset-fashion-mnist; the main job needs it" \
              "(the tests make their own data)." >&2
  else
    echo "Fashion-MNIST is missing: run 'sudo apt-get install -y dataset-fashion-mnist'" \
         "or set --config.dataset.data_dir to a directory holding its four IDX files." >&2
  fi
fi
