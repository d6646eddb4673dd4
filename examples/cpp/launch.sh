#!/usr/bin/env bash
# Starts N local ranks of the example trainer with the environment torchrun
# would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT, and OMP_NUM_THREADS=1 unless it is set: torchrun's default when
# several ranks share a node, so ranks do not oversubscribe the cores with
# intra-op threads), one run directory for all of them, then summarises the run.
#
#   launch.sh --ranks 4 --steps 60 --trainer build/examples/cpp/rankscope_example_train \
#             --cli build/lib/rankscope --dir rankscope-runs [--check] [--bind] [-- trainer args...]
#
# --bind pins rank r to the r-th CPU this launcher may run on (cyclically;
# taskset), as Slurm's --cpu-bind or numactl would: each rank's threads stay
# on its core, so the scheduler's placement does not change from one second
# to the next (the A/B harness uses it: its A/A noise here drops from +-4-9 %
# to within +-0.8 %).
set -euo pipefail

ranks=4 steps=60 trainer="" cli="" dir="rankscope-runs" check=0 bind=0 extra=()
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --trainer) trainer=$2; shift 2 ;;
    --cli) cli=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --check) check=1; shift ;;
    --bind) bind=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$trainer" ]] || { echo "launch.sh: --trainer '$trainer' is not an executable" >&2; exit 2; }

run_id="example-$(date +%Y%m%d-%H%M%S)-$$"
run_dir="$dir/$run_id"
mkdir -p "$run_dir"
store="$run_dir/.store"
rm -f "$store"

# The CPUs we may run on ("0-3,8" expanded), not 0..nproc-1: under a cpuset
# those need not exist, and nproc obeys OMP_NUM_THREADS besides.
cpus=()
IFS=, read -ra ranges <<<"$(awk '/^Cpus_allowed_list:/{print $2}' /proc/self/status)"
for range in "${ranges[@]}"; do
  if [[ $range == *-* ]]; then mapfile -t -O "${#cpus[@]}" cpus < <(seq "${range%-*}" "${range#*-}"); else cpus+=("$range"); fi
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
pids=()
for ((r = 0; r < ranks; r++)); do
  pin=()
  if ((bind)); then pin=(taskset -c "${cpus[r % ${#cpus[@]}]}"); fi
  RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r LOCAL_WORLD_SIZE=$ranks GROUP_RANK=0 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
  RANKSCOPE_RUN_ID="$run_id" RANKSCOPE_DIR="$run_dir" \
    "${pin[@]}" "$trainer" --store "$store" --steps "$steps" "${extra[@]}" &
  pids+=($!)
done
failed=0
for ((r = 0; r < ranks; r++)); do
  if ! wait "${pids[$r]}"; then
    echo "launch.sh: rank $r failed" >&2
    failed=1
  fi
done
rm -f "$store"

echo
echo "== run directory: $run_dir"
ls -l "$run_dir"
summary_rc=0
if [[ -n "$cli" ]]; then
  echo
  echo "== rankscope summary $run_dir"
  "$cli" summary "$run_dir" || summary_rc=$?
  echo
  echo "== rankscope triage $run_dir"
  "$cli" triage "$run_dir" || true
  echo
  echo "== rankscope timeline $run_dir -o $run_dir/trace.json"
  "$cli" timeline "$run_dir" -o "$run_dir/trace.json" || true
fi
((failed == 0)) || exit 1

if ((check)); then
  # Every rank logged every step, closed its log, and rank 0 wrote run.json.
  [[ -f "$run_dir/run.json" ]] || { echo "check: run.json missing" >&2; exit 1; }
  for ((r = 0; r < ranks; r++)); do
    log="$run_dir/rank-$r.jsonl"
    n=$(grep -c '"kind":"step_end"' "$log" || true)
    [[ "$n" == "$steps" ]] || { echo "check: rank $r logged $n step_end lines, expected $steps" >&2; exit 1; }
    for p in loader_wait forward backward all_reduce optimizer; do
      grep -q "\"name\":\"$p\"" "$log" || { echo "check: rank $r has no $p phase" >&2; exit 1; }
    done
    grep -q '"kind":"run_end"' "$log" || { echo "check: rank $r has no run_end" >&2; exit 1; }
  done
  ((summary_rc == 0)) || { echo "check: rankscope summary reported findings (exit $summary_rc)" >&2; exit 1; }
  # Stragglers and slow steps can be real on a busy machine (ranks share cores);
  # anything else from triage means the run is broken.
  tri=$("$cli" triage --json "$run_dir" || true)
  if grep -Eq '"kind":"(hang|dead_rank|missing_rank|liveness|collective_mismatch|stall|errors)"' <<<"$tri"; then
    echo "check: rankscope triage reported a problem: $tri" >&2
    exit 1
  fi
  json=$("$cli" summary --json "$run_dir" || true)
  grep -q '"missing_ranks":\[\]' <<<"$json" || { echo "check: missing ranks" >&2; exit 1; }
  grep -q "\"comm\":\"world\",\"max_seq\":$((steps + 1)),\"ranks\":\[0" <<<"$json" ||
    { echo "check: expected $((steps + 1)) collectives on 'world' (steps + final barrier): $json" >&2; exit 1; }
  echo "check: ok ($ranks ranks x $steps steps)"
fi
