# Sourced by the tests that launch the example trainer's ranks in the background.
# kill_ranks DIR...: SIGKILL every rank whose heartbeat file is under a DIR/*/
# (the heartbeat names the pid), so a failed test leaves no rank running.
# A heartbeat outlives its rank and pids come round again (pid_max is 32768 on
# these VMs, and a CI run starts tens of thousands of processes): a pid is
# killed only while it still holds a file of that run directory open (its run
# log), never whatever process has the number now.
kill_ranks() {
  local f pid run
  for dir in "$@"; do
    for f in "$dir"/*/rank-*.heartbeat.json; do
      [[ -f $f ]] || continue
      pid=$(grep -o '"pid":[0-9]*' "$f" | cut -d: -f2)
      run=$(cd "$(dirname "$f")" && pwd -P)
      [[ -n $pid ]] && holds_open "$pid" "$run" && kill -9 "$pid" 2>/dev/null || true
    done
  done
}
# holds_open PID DIR: whether process PID has a file under DIR open.
holds_open() {
  local fd
  for fd in /proc/"$1"/fd/*; do
    [[ $(readlink "$fd" 2>/dev/null) == "$2"/* ]] && return 0
  done
  return 1
}

# launch_ranks NAME WORK RANKS TRAINER -- ARGS...: starts RANKS ranks of the
# example trainer in the background for 100000 steps (output: WORK/launch.log),
# kills them when the test exits, and makes `fail MSG` print the log and exit 1.
ranks_sh_dir=$(dirname "${BASH_SOURCE[0]}")
launch_ranks() {
  test_name=$1 work_dir=$2
  local n=$3 bin=$4
  shift 5
  bash "$ranks_sh_dir/../examples/cpp/launch.sh" --ranks "$n" --steps 100000 --trainer "$bin" --dir "$work_dir" \
    -- "$@" >"$work_dir/launch.log" 2>&1 &
  launcher=$!
  trap 'kill_ranks "$work_dir"; wait "$launcher" 2>/dev/null || true' EXIT
}
fail() { echo "$test_name: $*"; cat "$work_dir/launch.log"; exit 1; }
