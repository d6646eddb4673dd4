#!/usr/bin/env bash
# rankscope on a real NVIDIA GPU: one command, run from the repository root on a
# machine with one GPU, CUDA, NCCL and PyTorch (the device tool's H100/H200 image)
# and no network. It builds what it needs there from the working tree and the
# Debian packages tests/gpu/fetch_deps.sh put into .gpu/debs, then runs:
#   tests/gpu/nccl_check.cpp  RANKSCOPE_NCCL on a real communicator: device timing
#                             against CUDA events, a device-side hang seen as a stall
#   tests/gpu/check_torch.py  the Python package: CUDA loss read back without a sync,
#                             NVML against nvidia-smi, torch.distributed on NCCL timed on
#                             the device, device phase time against torch.cuda.Event, a
#                             GPU stuck ahead of an all-reduce named as such, the step's cost
# Results go to $OUT (the device tool's folder; a temporary one elsewhere):
# machine.txt, build.log, nccl_check.json, torch.json, run.log. Exit 0: every check
# that asserts held; 1: one did not (or the build failed); 77: no GPU here (what
# precedes the GPU checks ran: the build included).
#
#   bash tests/gpu/fetch_deps.sh      # here, once
#   device run: bash tests/gpu/run.sh, carry [".gpu"], timeout_s 540
#
# PYTHON: the interpreter whose torch to build against and test (default python3,
# the image's). Budget: ~8 minutes on 16 cores, most of it the build.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
python=${PYTHON:-python3}
t0=$SECONDS
say() { echo "== [$((SECONDS - t0)) s] $*"; }

say "the machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)' 2>&1
  for tool in nvcc cmake ninja gcc g++ pkg-config; do echo "$tool: $(command -v "$tool" || echo none)"; done
  echo "cores: $(nproc)"
} | tee "$out/machine.txt"

say "dependencies: the carried Debian packages into a prefix of their own (never into /)"
prefix=/tmp/rankscope-deps
if ls .gpu/debs/*.deb >/dev/null 2>&1; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "no .gpu/debs (bash tests/gpu/fetch_deps.sh makes it): the machine's own packages, if any"
fi
# NCCL as torch loads it (the nvidia-nccl wheel), so both use one library.
nccl=$("$python" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
nccl_defs=()
if [[ -n "$nccl" && -f "$nccl/include/nccl.h" ]]; then
  nccl_lib=$(ls "$nccl"/lib/libnccl.so* | head -1)
  nccl_defs=(-C "cmake.define.RANKSCOPE_NCCL_INCLUDE_DIR=$nccl/include" -C "cmake.define.RANKSCOPE_NCCL_LIBRARY=$nccl_lib")
  echo "NCCL: $nccl_lib"
fi

say "build: the Python package (pip, no network: no build isolation) with the NCCL part and the GPU checks"
# Into a folder of its own (--target), so the interpreter's environment stays as it was; the
# checks below put it first on their path.
site=/tmp/rankscope-gpu-site
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
if ! "$python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --no-index --target "$site" . \
    -C build-dir=build-gpu -C cmake.define.RANKSCOPE_WITH_NCCL=ON -C cmake.define.RANKSCOPE_BUILD_GPU_CHECKS=ON \
    -C cmake.define.RANKSCOPE_WITH_OTLP=OFF -C cmake.define.RANKSCOPE_WITH_PROMETHEUS=OFF "${nccl_defs[@]}" \
    >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  say "build FAILED (build.log)"
  exit 1
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c 'import rankscope; print("rankscope", rankscope.__file__)'

say "NCCL hooks on the device (tests/gpu/nccl_check.cpp)"
build-gpu/tests/gpu/rankscope_gpu_nccl_check /tmp/rankscope-gpu-nccl-run >"$out/nccl_check.json"
rc_nccl=$?
cat "$out/nccl_check.json"
if ((rc_nccl == 77)); then
  say "no GPU here: stopped where the checks need one"
  exit 77
fi

say "the Python package on the device (tests/gpu/check_torch.py)"
"$python" tests/gpu/check_torch.py /tmp/rankscope-gpu-checks >"$out/torch.json"
rc_torch=$?
cat "$out/torch.json"

say "done: nccl_check exit $rc_nccl, check_torch exit $rc_torch"
((rc_nccl == 0 && rc_torch == 0))
