#!/usr/bin/env bash
# The venv of the peers that must not share .venv: oneCCL (its wheels bring
# Intel MPI's mpirun, which would shadow Open MPI's) and DeepSpeed (its
# shared-memory CPU allreduce). build/peers-venv, idempotent; the torch there
# is the project's pin (never another: everything else installs with
# --no-deps or under a constraint). About a minute, plus ~45 s for the JIT
# build of DeepSpeed's op on its first run.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=build/peers-venv
TORCH_VERSION=$(sed -n 's/^TORCH_VERSION=//p' tools/setup/deps.sh)
if [[ ! -x $V/bin/python ]]; then
  python3 -m venv "$V" || { echo "peers: ERROR: python3 -m venv failed" >&2; exit 1; }
fi
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
echo "torch==${TORCH_VERSION}" > "$pin"
"$V/bin/python" -c "import torch" 2>/dev/null || "$V/bin/pip" install -q "torch==${TORCH_VERSION}"
"$V/bin/pip" install -q --no-deps oneccl-cpu==2021.16.2 oneccl-devel==2021.16.2 impi-rt==2021.16.2
"$V/bin/pip" install -q -c "$pin" numpy hjson py-cpuinfo ninja psutil 'pydantic>=2' packaging msgpack einops tqdm
"$V/bin/pip" install -q --no-deps --no-build-isolation deepspeed==0.19.8
echo "peers: $V ready (oneCCL 2021.16.2, DeepSpeed 0.19.8, torch ${TORCH_VERSION})"
