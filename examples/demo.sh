#!/usr/bin/env bash
# The main job (README, command 1): set up, build, train on 4 local ranks with
# libtorch + gloo, and print what rankscope recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DRANKSCOPE_WITH_TORCH=ON -DRANKSCOPE_WITH_NVTX=ON -DRANKSCOPE_WITH_NCCL=ON -DRANKSCOPE_WITH_PROMETHEUS=ON -DRANKSCOPE_WITH_OTLP=ON -DRANKSCOPE_WITH_PYTHON=ON >/dev/null
cmake --build build -j2 --target rankscope_example_train rankscope_cli rankscope_python_package
bash examples/cpp/launch.sh --ranks "${RANKS:-4}" --steps "${STEPS:-200}" \
  --trainer build/examples/cpp/rankscope_example_train --cli build/lib/rankscope --dir rankscope-runs

# The same from Python: DDP over gloo with rankscope.torch, then triage.
echo
echo "== Python: examples/python/train_ddp.py (DDP, gloo, 2 ranks)"
PYTHONPATH=build/python /usr/bin/python3 examples/python/train_ddp.py --ranks 2 --epochs 2 --dir rankscope-runs
