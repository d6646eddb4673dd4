#!/usr/bin/env bash
# End-to-end overhead on real training: the example trainer on 2 ranks, steps
# alternating in blocks between instrumentation enabled and runtime-disabled
# in the same processes (interleaved A/B, so machine noise hits both alike).
#   benchmarks/ab_overhead.sh BUILD_DIR [STEPS] [BLOCK] [--ab-control]
# --ab-control runs the same schedule with both arms disabled (A/A): the
# ratio it prints is the noise floor of this machine for this measurement.
set -euo pipefail
build=${1:?usage: ab_overhead.sh BUILD_DIR [STEPS] [BLOCK]}
steps=${2:-4000}
block=${3:-20}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps "$steps" \
  --trainer "$build/examples/cpp/rankscope_example_train" --dir "$work" \
  -- --ab-block "$block" --checkpoint-every 0 "${@:4}" | grep -E "A/B|cost:"
