#!/usr/bin/env bash
# Installs what shoal needs on a fresh Debian 12 machine, idempotently:
# system packages (apt) and, with --python, the virtual environment .venv with
# the pinned PyTorch. Fails with a clear message when something can't be had.
set -euo pipefail
cd "$(dirname "$0")/../.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev libcli11-dev nlohmann-json3-dev
  libssl-dev libopenmpi-dev openmpi-bin iproute2
  clang libclang-rt-14-dev
)
TORCH_VERSION=2.13.0
# transformers and accelerate: the Hugging Face Trainer test (tests/python/test_hf_trainer.py).
# Pinned: docs/torch.md states what these versions hard-code. They resolve in
# the same pip call as the pinned torch, so they never pull another one.
TRANSFORMERS_VERSION=5.23.0
ACCELERATE_VERSION=1.15.0
# tensorflow-cpu: the TensorFlow front end (python/shoal/tensorflow) and its
# tests (tests/tensorflow); `make build` builds the ops against it. It adds
# about 600 MB to .venv and does not touch torch's pins (it brings keras 3).
TENSORFLOW_VERSION=2.21.0
# torchft: shoal.torchft (ProcessGroupShoal for torchft's Manager) and its tests
# (tests/python/test_torchft.py, which also runs torchft's own process-group
# and Manager tests: they import parameterized). Pure Python plus its Rust
# lighthouse inside the wheel; its torch>=2.7 resolves to the pinned torch.
TORCHFT_VERSION=0.2.0
PY_PACKAGES=("torch==${TORCH_VERSION}" numpy matplotlib pytest scikit-learn expecttest parameterized
             "transformers==${TRANSFORMERS_VERSION}" "accelerate==${ACCELERATE_VERSION}"
             "tensorflow-cpu==${TENSORFLOW_VERSION}" "torchft==${TORCHFT_VERSION}")

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: ERROR: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q "${missing[@]}" >/tmp/shoal-apt.log 2>&1; then
    $SUDO apt-get update -q >>/tmp/shoal-apt.log 2>&1 || true
    $SUDO apt-get install -y -q "${missing[@]}" >>/tmp/shoal-apt.log 2>&1 || {
      echo "setup: ERROR: could not install ${missing[*]} with apt-get (log: /tmp/shoal-apt.log)" >&2
      tail -n 20 /tmp/shoal-apt.log >&2
      exit 1
    }
  fi
fi

if [[ "${1:-}" == "--python" ]]; then
  PY=${PYTHON:-python3}
  if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv"
    $PY -m venv .venv || { echo "setup: ERROR: '$PY -m venv' failed (install python3-venv)" >&2; exit 1; }
  fi
  have=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
  need_install=0
  [[ "$have" == "$TORCH_VERSION" ]] || need_install=1
  for m in numpy matplotlib pytest sklearn expecttest parameterized; do
    .venv/bin/python -c "import $m" 2>/dev/null || need_install=1
  done
  for pin in "transformers==${TRANSFORMERS_VERSION}" "accelerate==${ACCELERATE_VERSION}" \
             "tensorflow-cpu==${TENSORFLOW_VERSION}" "torchft==${TORCHFT_VERSION}"; do
    .venv/bin/python -c "import importlib.metadata as m, sys; n, v = sys.argv[1].split('=='); sys.exit(m.version(n) != v)" \
      "$pin" 2>/dev/null || need_install=1
  done
  if ((need_install)); then
    echo "setup: installing into .venv: ${PY_PACKAGES[*]}"
    # torch is pinned and installed first, alone, so that nothing pulls a CUDA build.
    .venv/bin/pip install -q "torch==${TORCH_VERSION}" || {
      echo "setup: ERROR: pip could not install torch==${TORCH_VERSION}" >&2; exit 1; }
    .venv/bin/pip install -q "${PY_PACKAGES[@]}" || {
      echo "setup: ERROR: pip could not install ${PY_PACKAGES[*]}" >&2; exit 1; }
  fi
fi
