#!/usr/bin/env bash
# Idempotent machine setup: installs the Debian packages rankscope builds, tests
# and runs against. Safe to run repeatedly; does nothing when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev libabsl-dev catch2 libbenchmark-dev
  libtorch-dev libgloo-dev python3-torch python3-pytest python3-numpy pybind11-dev
  libopenblas0-pthread
  prometheus-cpp-dev libsimdjson-dev libcli11-dev libspdlog-dev
  prometheus libcurl4-openssl-dev zlib1g-dev nodejs python3-prometheus-client
  valgrind clang libclang-rt-14-dev time
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's default BLAS is the slow reference implementation; prefer OpenBLAS
# (a small MLP step goes from ~54 ms to ~3 ms).
if command -v update-alternatives >/dev/null; then
  for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
    target=$(update-alternatives --list "$alt" 2>/dev/null | grep -m1 openblas-pthread || true)
    if [[ -n "$target" ]]; then
      ${SUDO:-} update-alternatives --set "$alt" "$target" >/dev/null 2>&1 || true
    fi
  done
fi
# npm comes with nodesource's nodejs; Debian's nodejs needs the npm package.
if ! command -v npm >/dev/null; then
  ${SUDO:-$( [[ $(id -u) -ne 0 ]] && echo sudo )} apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
# The OTLP test receiver: the OpenTelemetry project's generated protobuf code
# (@opentelemetry/otlp-transformer, pinned by tests/otlp/package-lock.json).
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ -f "$here/tests/otlp/package-lock.json" && ! -d "$here/tests/otlp/node_modules/@opentelemetry/otlp-transformer" ]]; then
  (cd "$here/tests/otlp" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "setup: ok" >&2
