#!/usr/bin/env bash
# Run HERE (a Debian machine with a network), before tests/gpu/run.sh goes to a GPU
# machine that has none: the Debian packages our build needs that such a machine's
# image may lack (its image has CUDA, NCCL, PyTorch, CMake, ninja, pybind11 and
# scikit-build-core), downloaded into .gpu/debs (git-ignored, ~2 MB; the device
# tool's `carry` takes it along). run.sh unpacks them into a prefix of its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs=(libfmt-dev libfmt9 libabsl-dev libabsl20220623 libsimdjson-dev libsimdjson14 libcli11-dev)
mkdir -p .gpu/debs
(cd .gpu/debs && apt-get download "${pkgs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
ls .gpu/debs/*.deb >/dev/null
du -sh .gpu/debs
