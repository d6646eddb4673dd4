#!/usr/bin/env bash
# A real Prometheus server scrapes a running 2-rank example trainer:
#  - promtool accepts the shipped alert rules and a live /metrics page;
#  - the server's step series advances while the ranks train;
#  - promtool's unit tests of every shipped alert pass (tests/prometheus/rules_test.yml), each
#    rule has one, and each says what to do (a remediation annotation);
#  - rank 0's loss goes NaN at step 50: the NaN stays on the page and
#    RankscopeNonFiniteLoss fires in the server;
#  - after rank 1 blocks (forever, inside checkpoint_save), the stall rule's
#    expression (threshold shortened to 3 s for the test) becomes true, and
#    RankscopeRankStalled fires on the watchdog's own verdict (its learned
#    timeout's floor lowered from 15 s to 3 s for the test);
#  - a second job whose rank 1 never joins init_process_group: RankscopeRankStalled fires
#    for its rank 0 before any step (4 x the floor inside init_process_group: 12 s here);
#  - the server runs the shipped examples/prometheus/prometheus.yml (file_sd targets: the
#    ranks' base port + local rank), and every query of the shipped Grafana dashboard
#    (examples/grafana/rankscope-dashboard.json) returns series from it (the first job samples
#    its resources every second through the fake NVML and a host root with one RDMA port, so
#    the GPU and network panels have data too; it evaluates every 5 steps and gives its FLOPs
#    per step: the evaluation loss and MFU).
# Every wait is for an event of the run or the server (tests/wait.sh), never for a time.
set -euo pipefail
source "$(dirname "$0")/ranks.sh"
source "$(dirname "$0")/wait.sh"
trainer=$1 work=$2 rules=$3 fake_nvml=$4
examples=$(cd "$(dirname "$0")/../examples" && pwd)
rm -rf "$work"; mkdir -p "$work"
fail() { echo "prometheus test: $*"; tail -20 "$work/train.log" "$work/prometheus.log" 2>/dev/null; exit 1; }
promtool check rules "$rules" >/dev/null || fail "promtool rejects $rules"
(cd "$(dirname "$0")/prometheus" && promtool test rules rules_test.yml) || fail "promtool test rules failed"
# Every shipped rule has a promtool test that fires it and says what to do about it.
for alert in $(sed -n 's/^ *- alert: //p' "$rules"); do
  grep -q "alertname: $alert\$" "$(dirname "$0")/prometheus/rules_test.yml" || fail "$alert has no promtool test"
done
[[ $(grep -c '^ *- alert: ' "$rules") == $(grep -c '^ *remediation: ' "$rules") ]] || fail "a rule of $rules has no remediation"

# The first job's host as it is (/proc, /sys/block), plus one RDMA port whose counters read 0:
# the dashboard's RDMA panel has its series. Its GPUs (the fake NVML) are H100s, so MFU has a peak.
root=$work/host-root port=$work/host-root/sys/class/infiniband/mlx5_0/ports/1
mkdir -p "$port/counters" "$port/hw_counters"
ln -s /proc "$root/proc" && ln -s /sys/block "$root/sys/block"
for c in counters/symbol_error counters/link_downed hw_counters/local_ack_timeout_err hw_counters/np_cnp_sent; do
  echo 0 >"$port/$c"
done
echo "4: ACTIVE" >"$port/state"

base=$((20000 + ($$ % 2000) * 4)) prom_port=$((base + 2))
RANKSCOPE_NVML_LIBRARY=$fake_nvml FAKE_NVML_NAME="NVIDIA H100 80GB HBM3" RANKSCOPE_FLOPS_PER_STEP=1e9 \
RANKSCOPE_HOST_ROOT=$root RANKSCOPE_RESOURCE_INTERVAL=1 \
RANKSCOPE_STALL_FLOOR=3 RANKSCOPE_PROMETHEUS_PORT=$base bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 100000 \
  --trainer "$trainer" --dir "$work/runs" -- --slow-rank 0 --slow-ms 25 --block-rank 1 --block-step 400 --nan-rank 0 --nan-step 50 \
  --eval-every 5 --timeout 600 >"$work/train.log" 2>&1 &
launcher=$!
base2=$((base + 8000))  # the second job's exporters (ranks 0 and 1)
RANKSCOPE_STALL_FLOOR=3 RANKSCOPE_PROMETHEUS_PORT=$base2 bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 \
  --steps 100000 --trainer "$trainer" --dir "$work/runs-init" -- --never-join-rank 1 --timeout 600 >"$work/init.log" 2>&1 &
prom=""
cleanup() {
  [[ -n "$prom" ]] && kill "$prom" 2>/dev/null || true
  kill_ranks "$work/runs" "$work/runs-init"
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Until the first step has ended (before that there is no step series yet).
first_step_on_page() {
  curl -sf "http://127.0.0.1:$base/metrics" >"$work/metrics.txt" 2>/dev/null &&
    grep -q '^rankscope_global_step{' "$work/metrics.txt"
}
wait_for "a step on /metrics" first_step_on_page || fail "no step on /metrics on port $base"
promtool check metrics <"$work/metrics.txt" || fail "promtool rejects the /metrics page"
grep -q '^rankscope_global_step{host=' "$work/metrics.txt" || fail "no rankscope_global_step"

# The stall rule with a 3 s threshold and no `for`, so the test is short.
sed -e 's/> 600/> 3/' -e 's/for: 2m/for: 0s/' "$rules" >"$work/rules.yml"
# The shipped configuration, scraping every second; its file_sd targets: both jobs' ranks.
promtool check config "$examples/prometheus/prometheus.yml" >/dev/null || fail "promtool rejects prometheus.yml"
sed -e 's/_interval: 15s/_interval: 1s/' -e 's/rankscope.rules.yml/rules.yml/' "$examples/prometheus/prometheus.yml" \
  >"$work/prometheus.yml"
mkdir -p "$work/targets"
echo "[{\"targets\": [\"127.0.0.1:$base\", \"127.0.0.1:$((base + 1))\", \"127.0.0.1:$base2\", \"127.0.0.1:$((base2 + 1))\"]}]" \
  >"$work/targets/job.json"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom=$!

query() {  # prints the first sample's value of an instant query, or nothing
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
    grep -o '"value":\[[0-9.]*,"[^"]*"' | head -1 | sed 's/.*,"//; s/"$//'
}
first="" later=""
scraped() { first=$(query 'max(rankscope_global_step)' || true); [[ -n "$first" ]]; }
wait_for "Prometheus to scrape a step" scraped || fail "Prometheus never scraped a step"
advanced() { later=$(query 'max(rankscope_global_step)' || true); [[ -n "$later" ]] && awk "BEGIN{exit !($later > $first)}"; }
wait_for "the step series to advance" advanced || fail "the step series did not advance ($first -> $later)"
echo "step series advanced: $first -> $later"

firing() {  # firing ALERT [LABELS]: prints how many series of ALERT fire, once some do; nothing if none ever did
  local n=""
  fires() { n=$(query "count(ALERTS{alertname=\"$1\",alertstate=\"firing\"${2:+,$2}})" || true); [[ -n "$n" ]]; }
  wait_for "$1 to fire" fires "$@" >&2 || true
  echo "$n"
}
nonfinite=$(firing RankscopeNonFiniteLoss)
[[ -n "$nonfinite" ]] || fail "RankscopeNonFiniteLoss never fired after rank 0's loss went NaN"
# Read whole, then searched: `curl | grep -q` under pipefail fails when grep stops reading
# first (curl's SIGPIPE), and the page is long.
curl -sf "http://127.0.0.1:$base/metrics" >"$work/metrics-nan.txt" || fail "no /metrics on port $base"
grep -q '^rankscope_loss{.*} Nan$' "$work/metrics-nan.txt" || fail "the NaN loss is not on the page"
echo "non-finite loss rule firing for $nonfinite series"

job1="instance=~\"127.0.0.1:($base|$((base + 1)))\""  # not the second job's ranks
stalled=$(firing RankscopeJobStalled "$job1")
[[ -n "$stalled" ]] || fail "the stall rule never fired after rank 1 blocked"
echo "stall rule firing for $stalled series; at step $(query 'max(rankscope_global_step)')"
rank_stalled=$(firing RankscopeRankStalled "$job1")  # the watchdog's own verdict, default (learned) timeout
[[ -n "$rank_stalled" ]] || fail "RankscopeRankStalled never fired after rank 1 blocked"
echo "rank stall rule firing for $rank_stalled series"
before_first=$(firing RankscopeRankStalled "instance=\"127.0.0.1:$base2\"")
[[ -n "$before_first" ]] || fail "RankscopeRankStalled never fired for the rank waiting in init_process_group"
echo "rank stall rule firing before the first step (rank 0 waits in init_process_group for rank 1)"

# Every query of the shipped dashboard returns series ($run_id: all runs; $__rate_interval: 30 s).
series() {  # how many series an instant query returns
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" | grep -o '"metric":' | wc -l
}
while IFS=$'\t' read -r title expr; do
  expr=${expr//'$run_id'/.*}
  expr=${expr//'$__rate_interval'/30s}
  has_series() { [[ $(series "$expr") -gt 0 ]]; }
  wait_for "the dashboard's '$title'" has_series || fail "dashboard panel '$title' has no data: $expr"
done < <(python3 -c 'import json, sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p["targets"]:
        print(p["title"] + "\t" + t["expr"])' "$examples/grafana/rankscope-dashboard.json")
echo "dashboard: every panel's query returns series"
echo "prometheus test: ok"
