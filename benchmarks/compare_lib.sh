#!/usr/bin/env bash
# The background thread's CPU per record on the real trainer, this build's
# librankscope against another build's, in alternating runs (so machine
# noise hits both alike). The other library must be ABI-compatible: build
# the commit to compare against with only the core target, e.g.
#   git worktree add /tmp/old <commit>
#   cmake -S /tmp/old -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DRANKSCOPE_BUILD_TESTS=OFF -DRANKSCOPE_BUILD_BENCHMARKS=OFF -DRANKSCOPE_BUILD_EXAMPLES=OFF
#   cmake --build /tmp/old/build --target rankscope_core
#   benchmarks/compare_lib.sh build /tmp/old/build/lib
# The trainer runs one rank with a tiny model (--hidden 8 --batch 4), where
# the background thread's work is most of what varies; the figure is the
# trainer's own "cost:" line (background CPU over the whole run / records).
#   benchmarks/compare_lib.sh BUILD_DIR OTHER_LIB_DIR [ROUNDS=4] [STEPS=20000]
set -euo pipefail
build=${1:?usage: compare_lib.sh BUILD_DIR OTHER_LIB_DIR [ROUNDS] [STEPS]}
other=${2:?usage: compare_lib.sh BUILD_DIR OTHER_LIB_DIR [ROUNDS] [STEPS]}
rounds=${3:-4}
steps=${4:-20000}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # prints ns per record
  bash "$here/../examples/cpp/launch.sh" --ranks 1 --steps "$steps" \
    --trainer "$build/examples/cpp/rankscope_example_train" --dir "$work" \
    -- --checkpoint-every 0 --hidden 8 --batch 4 2>&1 | sed -n 's/.*(\([0-9.]*\) ns\/record.*/\1/p'
}
for i in $(seq "$rounds"); do
  echo "other $(LD_LIBRARY_PATH="$other" run)"
  echo "this  $(run)"
done | awk '{print; s[$1] += $2; n[$1]++}
  END {printf "mean ns/record: this %.1f, other %.1f (%+.1f %%)\n", s["this"]/n["this"], s["other"]/n["other"],
       100 * (s["this"]/n["this"] / (s["other"]/n["other"]) - 1)}'
