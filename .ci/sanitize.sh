#!/usr/bin/env bash
# The unit tests under a sanitizer: address (ASan+UBSan) or thread (TSan); .ci/run
# runs both. Needs the Debian packages .ci/setup.sh installs.
#   bash .ci/sanitize.sh address|thread
set -euo pipefail
cd "$(dirname "$0")/.."
san=${1:?usage: .ci/sanitize.sh address|thread}
# A unity build (batches of 8 files compiled as one): the heavy headers (Abseil, fmt, Catch2)
# are compiled once a batch, not once a file, which roughly halves this stage's compile time.
cmake -S . -B "build-$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DRANKSCOPE_SANITIZE="$san" \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
  -DRANKSCOPE_WITH_NCCL=ON -DRANKSCOPE_WITH_OTLP=ON -DRANKSCOPE_WITH_PROMETHEUS=ON \
  -DRANKSCOPE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "build-$san" -j2 --target rankscope_tests rankscope_tests_compiled_out rankscope_tests_nccl \
  rankscope_tests_otlp rankscope_tests_prometheus rankscope_gpu_nccl_check rankscope_tests_device rankscope_fake_cudart
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir "build-$san" --output-on-failure -j2 -L unit
