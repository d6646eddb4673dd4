#!/usr/bin/env bash
# The suite on a loaded machine: another process keeps every core busy while the
# tests run, because this is how CI's shared 2-core VMs behave (their cores slow
# down 1.3-2x for minutes) and a test must not depend on how fast the machine is.
#
#   bash tests/stress_ci.sh [RUNS]           ctest on the existing build/ (after .ci/run),
#                                            RUNS times in a row (default 5)
#   bash tests/stress_ci.sh --fresh [RUNS]   the README's test command, `bash .ci/run`, on a
#                                            fresh clone of this checkout's HEAD each time
#                                            (setup included; the clone is removed after a
#                                            pass, kept after a failure)
#
# The load: stress-ng (Debian's package; .ci/setup.sh installs it) with one CPU worker
# per core at normal priority, so the tests get about half of each core and are
# preempted at any point. Stops at the first failure (exit 1); prints each run's
# commit, start time and wall time, the lines to quote in a note.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fresh=0
if [[ ${1:-} == --fresh ]]; then fresh=1; shift; fi
runs=${1:-5}
command -v stress-ng >/dev/null || { echo "stress_ci: no stress-ng (bash .ci/setup.sh installs it)" >&2; exit 2; }
if ((!fresh)) && [[ ! -f "$here/build/CTestTestfile.cmake" ]]; then
  echo "stress_ci: no build/ to test (run bash .ci/run first, or use --fresh)" >&2
  exit 2
fi

stress_pid=""
stop_load() { [[ -z "$stress_pid" ]] || kill "$stress_pid" 2>/dev/null || true; wait 2>/dev/null || true; stress_pid=""; }
trap stop_load EXIT
start_load() {
  stress-ng --cpu "$(nproc)" --cpu-load 100 --timeout 0 --quiet &
  stress_pid=$!
}

for ((i = 1; i <= runs; i++)); do
  commit=$(git -C "$here" rev-parse --short HEAD)  # per run: the checkout may move on between runs
  start_load
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ) t0=$SECONDS rc=0
  if ((fresh)); then
    clone=$(mktemp -d "${TMPDIR:-/tmp}/rankscope-stress-XXXXXX")
    git clone -q "$here" "$clone/rankscope"
    commit=$(git -C "$clone/rankscope" rev-parse --short HEAD)  # what this run tests
    (cd "$clone/rankscope" && bash .ci/run) >"$clone/ci.log" 2>&1 || rc=$?
    log="$clone/ci.log"
  else
    log=$(mktemp "${TMPDIR:-/tmp}/rankscope-stress-XXXXXX.log")
    ctest --test-dir "$here/build" --output-on-failure -j2 -LE gpu >"$log" 2>&1 || rc=$?
  fi
  stop_load
  took=$((SECONDS - t0))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  if ((rc != 0)); then
    echo "stress_ci: run $i/$runs FAILED (commit $commit, started $started, ${took} s, load $load): $log"
    grep -E "^(The following tests FAILED|[[:space:]]+[0-9]+ - )|FAILED|Failed" "$log" | tail -20 || true
    exit 1
  fi
  echo "stress_ci: run $i/$runs passed (commit $commit, started $started, ${took} s under load, load $load)"
  if ((fresh)); then grep "^== \[" "$log" | sed 's/^/  /' || true; fi  # .ci/run's stage times
  if ((fresh)); then rm -rf "$clone"; else rm -f "$log"; fi
done
echo "stress_ci: $runs/$runs runs passed under load"
