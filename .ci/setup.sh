#!/usr/bin/env bash
# Idempotent machine setup (README, both commands start here):
#  1. the Debian packages rankscope builds, tests and runs against (apt; root or sudo);
#  2. the project virtualenv .venv/ (git-ignored) with the pinned torch from PyPI
#     (requirements/torch.txt) and the build and test tools (requirements/dev.txt).
# Safe to run repeatedly: it does nothing when everything is present.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev libabsl-dev catch2 libbenchmark-dev
  libdw-dev                        # elfutils: stack frames named from a module's full symbol table
  libgloo-dev                      # gloo's headers: the C++ example's ProcessGroupGloo (libtorch is the wheel's)
  prometheus-cpp-dev libsimdjson-dev libcli11-dev libspdlog-dev
  prometheus libcurl4-openssl-dev zlib1g-dev
  python3-venv python3-dev
  valgrind clang libclang-rt-14-dev time
  ccache                           # CI: the second venv's pip build reuses the first one's objects
  libjs-chart.js                   # Chart.js, embedded into `rankscope report` pages at build time
  chromium                         # headless: the report test renders the page and screenshots it
  stress-ng                        # tests/stress_ci.sh: the suite while every core is kept busy
  debootstrap                      # tests/check_binary_wheel.sh: a clean Debian 12 for the binary wheel
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The virtualenvs: python3 on PATH (3.9+) makes them; pip installs the pinned
# requirements only when they changed since the last successful install.
#   .venv/            torch from requirements/torch.txt (the one everything builds against),
#                     and the training frameworks the integrations are tested with (frameworks.txt)
#   .venv-torch-min/  the oldest tested torch (requirements/torch-min.txt), for the Python tests
py=${RANKSCOPE_SETUP_PYTHON:-python3}
make_venv() {  # DIR REQUIREMENTS...
  local venv="$here/$1"; shift
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv with $($py --version 2>&1)" >&2
    "$py" -m venv "$venv"
  fi
  local stamp="$venv/.rankscope-requirements" want args=()
  want=$(cd "$here" && cat "$@" | sha256sum | cut -d' ' -f1)
  if [[ ! -f "$stamp" || $(cat "$stamp") != "$want" ]]; then
    for r in "$@"; do args+=(-r "$here/$r"); done
    # torch with its CUDA libraries unpacks to ~5.5 GB per virtualenv; say so
    # up front instead of letting pip fail halfway with ENOSPC.
    local need_kb=$((7 * 1024 * 1024)) free_kb
    free_kb=$(df -Pk "$here" | awk 'NR==2 {print $4}')
    if [[ -n "$free_kb" && "$free_kb" -lt "$need_kb" ]]; then
      echo "setup: only $((free_kb / 1024)) MiB free on $(df -P "$here" | awk 'NR==2 {print $6}');" \
           "installing torch into $venv needs about 7 GiB (free space, or clean old checkouts' .venv*/)" >&2
      exit 1
    fi
    echo "setup: $1 ... into $venv (torch is ~4 GB the first time)" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${args[@]}"
    echo "$want" >"$stamp"
  fi
}
make_venv .venv requirements/torch.txt requirements/dev.txt requirements/frameworks.txt
if [[ -z "${RANKSCOPE_SETUP_NO_TORCH_MIN:-}" ]]; then
  make_venv .venv-torch-min requirements/torch-min.txt requirements/dev.txt
fi
echo "setup: ok ($("$here/.venv/bin/python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))" >&2
