#!/usr/bin/env bash
# Installs what hfl needs on a fresh Debian/Ubuntu machine; safe to rerun (idempotent).
#   - Python packages pinned in requirements.txt (pip);
#   - Fashion-MNIST IDX files from Debian's dataset-fashion-mnist package
#     (/usr/share/datasets/fashion-mnist), the default dataset;
#   - tcmalloc (Debian's libtcmalloc-minimal4), the allocator hfl.runtime preloads:
#     about twice the CPU training speed of glibc malloc (docs/benchmarks.md). Without
#     root or apt-get it only warns; hfl then runs with glibc malloc tunables, slower.
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

# Installs Debian package $1 when root has apt-get, else prints $2 as a warning.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -qq "$1" >/dev/null 2>&1) || {
      apt-get update -qq >/dev/null && apt-get install -y -qq "$1" >/dev/null; } \
      || echo "warning: could not install $1; $2" >&2
  else
    echo "warning: $1 is not installed, and installing it needs root and apt-get; $2" >&2
  fi
}

# The same search hfl.runtime does at start-up.
if ! "$PY" -c 'import sys; from hfl import runtime; sys.exit(runtime.find_tcmalloc() is None)'; then
  apt_install libtcmalloc-minimal4 "hfl runs slower on CPU without it (glibc malloc \
tunables instead); install it with 'sudo apt-get install -y libtcmalloc-minimal4'."
fi
