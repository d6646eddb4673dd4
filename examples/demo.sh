#!/usr/bin/env bash
# The main job (README, command 1): set up, build, train on 4 local ranks with
# libtorch + gloo and print what rankscope recorded; then the same from Python:
# torchrun, DDP over gloo with the pip-installed package, and `rankscope triage`.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKSCOPE_SETUP_NO_TORCH_MIN=1 bash .ci/setup.sh   # the oldest-torch venv is for the tests only
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRANKSCOPE_WITH_TORCH=ON -DRANKSCOPE_WITH_NVTX=ON -DRANKSCOPE_WITH_NCCL=ON -DRANKSCOPE_WITH_PROMETHEUS=ON -DRANKSCOPE_WITH_OTLP=ON >/dev/null
cmake --build build -j2 --target rankscope_example_train rankscope_cli
bash examples/cpp/launch.sh --ranks "${RANKS:-4}" --steps "${STEPS:-200}" \
  --trainer build/examples/cpp/rankscope_example_train --cli build/lib/rankscope --dir rankscope-runs

echo
echo "== Python: pip install --no-build-isolation . (into .venv, against its torch)"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation .
echo "== torchrun --standalone --nproc-per-node 2 examples/python/train_ddp.py (DDP, gloo)"
run_dir=$(OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 2 examples/python/train_ddp.py --epochs 2 | tail -n 1)
echo "== rankscope triage $run_dir"
.venv/bin/rankscope triage "$run_dir" || true   # exit 1 means findings: shown above, not a failure of the demo
