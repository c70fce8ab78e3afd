#!/usr/bin/env bash
# Installs what shoal needs on a fresh Debian 12 machine, idempotently:
# system packages (apt) and, with --python, the virtual environment .venv with
# the pinned PyTorch and what `make demo` needs; --test adds the test
# dependencies (TensorFlow, transformers ...), --bench what `make bench` plots
# with. Fails with a clear message when something can't be had.
set -euo pipefail
cd "$(dirname "$0")/../.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev libcli11-dev nlohmann-json3-dev
  libssl-dev libopenmpi-dev openmpi-bin iproute2
  clang libclang-rt-14-dev
)
TORCH_VERSION=2.13.0
# The Python packages, in three groups, each installed by the targets that need it:
# --python: what `make demo` needs: the pinned torch (the backend builds against
# it), numpy, and scikit-learn (the demo's data set, handwritten digits).
DEMO_PACKAGES=(numpy scikit-learn)
# --test: what the test targets add (make test-*; docs/testing.md).
# transformers and accelerate: the Hugging Face Trainer test (tests/python/test_hf_trainer.py).
# Pinned: docs/torch.md states what these versions hard-code. They resolve in
# the same pip call as the pinned torch, so they never pull another one.
TRANSFORMERS_VERSION=5.23.0
ACCELERATE_VERSION=1.15.0
# tensorflow-cpu: the TensorFlow front end (python/shoal/tensorflow) and its
# tests (tests/tensorflow); the tests' build builds the ops against it. It adds
# about 600 MB to .venv and does not touch torch's pins (it brings keras 3).
TENSORFLOW_VERSION=2.21.0
# torchft: shoal.torchft (ProcessGroupShoal for torchft's Manager) and its tests
# (tests/python/test_torchft.py, which also runs torchft's own process-group
# and Manager tests: they import parameterized). Pure Python plus its Rust
# lighthouse inside the wheel; its torch>=2.7 resolves to the pinned torch.
TORCHFT_VERSION=0.2.0
# pytest-xdist: the Python suites run on two workers (pytest -n).
XDIST_VERSION=3.8.0
# expecttest: PyTorch's own distributed suite (tests/python/test_torch_suite.py).
TEST_PACKAGES=(pytest "pytest-xdist==${XDIST_VERSION}" expecttest parameterized
               "transformers==${TRANSFORMERS_VERSION}" "accelerate==${ACCELERATE_VERSION}"
               "tensorflow-cpu==${TENSORFLOW_VERSION}" "torchft==${TORCHFT_VERSION}")
# --bench: the plots of `make bench` (bench/compare/report.py).
BENCH_PACKAGES=(matplotlib)

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

python=0 groups=()
for arg in "$@"; do
  case "$arg" in
    --python) python=1 ;;
    --test)   python=1 groups+=(test) ;;
    --bench)  python=1 groups+=(bench) ;;
    *) echo "setup: ERROR: unknown option $arg (--python, --test, --bench)" >&2; exit 2 ;;
  esac
done

# Whether .venv has every package of a group ("name" or "name==version"), by
# its installed metadata (importing TensorFlow to ask would take seconds).
have_all() {
  .venv/bin/python - "$@" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        got = m.version(name)
    except m.PackageNotFoundError:
        sys.exit(1)
    if want and got.split("+")[0] != want:
        sys.exit(1)
PY
}

# pip_group NAME PACKAGES...: installs them beside the pinned torch (one
# resolution, so nothing pulls another torch), unless all are there already.
pip_group() {
  local what=$1; shift
  have_all "torch==${TORCH_VERSION}" "$@" && return 0
  echo "setup: installing into .venv ($what): $*"
  .venv/bin/pip install -q "torch==${TORCH_VERSION}" "$@" || {
    echo "setup: ERROR: pip could not install ($what): torch==${TORCH_VERSION} $*" >&2; exit 1; }
}

if ((python)); then
  PY=${PYTHON:-python3}
  if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv"
    $PY -m venv .venv || { echo "setup: ERROR: '$PY -m venv' failed (install python3-venv)" >&2; exit 1; }
  fi
  # torch is pinned and installed first, alone, so that nothing pulls a CUDA build.
  if ! have_all "torch==${TORCH_VERSION}"; then
    echo "setup: installing into .venv: torch==${TORCH_VERSION}"
    .venv/bin/pip install -q "torch==${TORCH_VERSION}" || {
      echo "setup: ERROR: pip could not install torch==${TORCH_VERSION}" >&2; exit 1; }
  fi
  pip_group demo "${DEMO_PACKAGES[@]}"
  for g in "${groups[@]}"; do
    case "$g" in
      test)  pip_group test "${TEST_PACKAGES[@]}" ;;
      bench) pip_group bench "${BENCH_PACKAGES[@]}" ;;
    esac
  done
fi
