# Sourced by the integration tests: waiting for what a real run does, paced by
# the run's own events rather than by sleeps.
#
# wait_for WHAT CMD...: runs CMD every 0.1 s until it succeeds. The bound
# (WAIT_BOUND_S, 240 s) only turns a hang into a message naming WHAT: it is
# far above the time anything waited for here takes (seconds, or a 15 s stall
# timeout), so a slow or loaded machine never reaches it; ctest's TIMEOUT is
# the last resort. Returns 1 (with the message on stdout) when it gives up.
wait_for() {
  local what=$1; shift
  local give_up=$((SECONDS + ${WAIT_BOUND_S:-240}))
  until "$@"; do
    if ((SECONDS >= give_up)); then
      echo "gave up after ${WAIT_BOUND_S:-240} s waiting for $what"
      return 1
    fi
    sleep 0.1
  done
}

# has FILE PATTERN: FILE exists and a line matches the grep pattern.
has() { grep -q -- "$2" "$1" 2>/dev/null; }
