#!/usr/bin/env bash
# End-to-end overhead on real training: the example trainer on 2 ranks, steps
# alternating in blocks between instrumentation enabled and runtime-disabled
# in the same processes (interleaved A/B, so machine noise hits both alike).
#   benchmarks/ab_overhead.sh BUILD_DIR [STEPS=20000] [BLOCK=500] [--ab-control]
# Each block ends with an untimed flush, so each arm carries the background
# thread's cost of its own records. RANKS=1 runs a single rank.
# --ab-control runs the same schedule with both arms disabled (A/A): the
# ratio it prints is the noise floor of this machine for this measurement.
# Each rank is pinned to its own core (launch.sh --bind; BIND=0 to let the
# scheduler place them): unpinned, the 2 ranks' threads migrate between the
# 2 cores and A/A runs here move by +-4-9 %; pinned, their intervals lie
# within +-0.8 %.
set -euo pipefail
build=${1:?usage: ab_overhead.sh BUILD_DIR [STEPS] [BLOCK]}
steps=${2:-20000}
block=${3:-500}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bind=(--bind)
[[ "${BIND:-1}" == 0 ]] && bind=()
bash "$here/../examples/cpp/launch.sh" --ranks "${RANKS:-2}" --steps "$steps" "${bind[@]}" \
  --trainer "$build/examples/cpp/rankscope_example_train" --dir "$work" \
  -- --ab-block "$block" --checkpoint-every 0 "${@:4}" | grep -E "A/B|cost:"
