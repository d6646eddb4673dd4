#!/usr/bin/env bash
# The binary wheel on a machine that never built anything: a minimal Debian 12
# made with debootstrap (Debian's package) into build/wheel-root/ — python3 and
# its venv module, no compiler, none of the -dev or runtime libraries the build
# used (abseil, fmt, simdjson, libcurl, prometheus-cpp, elfutils). There:
#   1. auditwheel (on the host) accepts the wheel as manylinux;
#   2. `pip install --no-index <wheel>` into a fresh venv: no compiler, no network;
#   3. the DDP example trains on 2 ranks under torchrun and `rankscope triage` reads
#      the run, with the C++ DDP hooks loaded (built against this torch);
#   4. under the oldest tested torch the package says once that it uses its Python
#      hooks, and still imports.
# torch (4 GB from PyPI with its CUDA libraries) is not downloaded again: the
# project's own virtualenvs' site-packages are bind-mounted read-only and put on
# the path after the venv's own, so `rankscope` comes from the wheel (checked).
#
#   bash tests/check_binary_wheel.sh WHEEL      (root: debootstrap, chroot, mount)
set -euo pipefail
# The mounts live in a mount namespace of this script's own: they vanish with it,
# however it ends, and the host never sees them (debootstrap made the device nodes).
[[ $(id -u) == 0 ]] || exec sudo bash "$0" "$@"   # debootstrap, chroot and mount need root
if [[ ${RANKSCOPE_WHEEL_NS:-} != 1 ]]; then
  RANKSCOPE_WHEEL_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
here=$(cd "$(dirname "$0")/.." && pwd)
wheel=$(realpath "$1")
root=$here/build/wheel-root
py=python3.11
fail() { echo "check_binary_wheel: $*" >&2; exit 1; }

# 1. auditwheel: every symbol within a manylinux policy, and no library from outside
# it except torch's own (libtorch*, libc10*: _torch_hooks loads them from the torch
# that imported it, as every extension built against torch does).
"$here/.venv/bin/auditwheel" show --json "$wheel" >"$here/build/auditwheel-show.json" 2>"$here/build/auditwheel-show.err" ||
  fail "auditwheel show failed: $(cat "$here/build/auditwheel-show.err")"
verdict=$("$here/.venv/bin/python" - "$here/build/auditwheel-show.json" <<'PY'
import fnmatch, json, sys
show = json.load(open(sys.argv[1]))
foreign = [lib for lib in show["external_libs"] if not fnmatch.fnmatch(lib, "libtorch*.so") and not fnmatch.fnmatch(lib, "libc10*.so")]
if not show["sym_tag"].startswith("manylinux_") or foreign:
    print(f"not manylinux: symbols {show['sym_tag']}, libraries from outside the policy {foreign}")
else:
    print(show["sym_tag"])
PY
)
[[ $verdict == manylinux_* ]] || fail "auditwheel: $verdict"

if [[ ! -f $root/.made ]]; then  # once per build tree: ~2.5 min, ~280 MB
  rm -rf "$root"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" http://deb.debian.org/debian \
    >"$here/build/debootstrap.log" 2>&1 || fail "debootstrap failed: $(tail -5 "$here/build/debootstrap.log")"
  touch "$root/.made"
fi
for tool in gcc cc g++ c++ cmake; do
  ! chroot "$root" sh -c "command -v $tool" >/dev/null || fail "the clean root has $tool"
done
! chroot "$root" sh -c 'ls /usr/lib/x86_64-linux-gnu/ | grep -qE "^lib(absl|fmt|simdjson|curl|prometheus-cpp|dw)"' ||
  fail "the clean root has a library the build used"

mount -t proc proc "$root/proc"
mount -t tmpfs tmpfs "$root/dev/shm"
for site in .venv:torch .venv-torch-min:torch-min; do  # read-only: torch, not a copy of it
  mkdir -p "$root/opt/${site#*:}"
  mount --bind "$here/${site%%:*}/lib/$py/site-packages" "$root/opt/${site#*:}"
  mount -o remount,bind,ro "$root/opt/${site#*:}"
done

# torchrun's rendezvous connects to "localhost" (debootstrap writes no /etc/hosts).
printf '127.0.0.1 localhost %s\n::1 localhost ip6-localhost\n' "$(hostname)" >"$root/etc/hosts"
rm -rf "$root/work" "$root/venv" "$root/venv-min"
mkdir -p "$root/work"
cp "$wheel" "$root/work/"
cp "$here/examples/python/train_ddp.py" "$root/work/"
in_root() { chroot "$root" env -i HOME=/root PATH=/venv/bin:/usr/bin:/bin LANG=C.UTF-8 sh -c "cd /work && $1"; }

# 2. install: no index, no compiler, timed; the second venv sees the oldest tested torch.
for v in venv venv-min; do
  chroot "$root" python3 -m venv "/$v"
  t0=$EPOCHREALTIME
  chroot "$root" "/$v/bin/pip" install -q --disable-pip-version-check --no-index "/work/$(basename "$wheel")" ||
    fail "pip install --no-index of the wheel failed in /$v"
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
done
echo /opt/torch >"$root/venv/lib/$py/site-packages/zz-project-torch.pth"
echo /opt/torch-min >"$root/venv-min/lib/$py/site-packages/zz-project-torch.pth"
echo "check_binary_wheel: pip install --no-index in a clean Debian 12 took ${took} s"

where=$(in_root "python -c 'import rankscope, rankscope.torch, torch; print(rankscope.__file__, torch.__version__)'" 2>&1) ||
  fail "import failed: $where"
grep -q "^/venv/lib/$py/site-packages/rankscope/__init__.py " <<<"$where" || fail "rankscope not imported from the wheel: $where"
! grep -q "using Python hooks" <<<"$where" || fail "the wheel's C++ DDP hooks did not load: $where"

# 3. the DDP example on 2 ranks, then triage.
in_root "timeout 600 python -m torch.distributed.run --standalone --nproc-per-node 2 train_ddp.py --epochs 1 --samples 512 \
  >train.log 2>&1" || fail "the DDP example failed: $(tail -20 "$root/work/train.log")"
! grep -q "using Python hooks" "$root/work/train.log" || fail "the C++ DDP hooks did not load in training"
run=$(cd "$root/work/rankscope-runs" && ls -d -- */ | head -1)
in_root "rankscope triage rankscope-runs/$run >triage.txt 2>&1" || fail "triage failed: $(cat "$root/work/triage.txt")"
grep -q "healthy, no findings" "$root/work/triage.txt" || fail "triage of a clean run: $(cat "$root/work/triage.txt")"
grep -q '"op":"all_reduce".*"wait_phase":"ddp_all_reduce_wait"' "$root/work/rankscope-runs/$run"rank-0.jsonl ||
  fail "no DDP gradient all-reduce span in rank 0's run log"

# 4. another torch: said once, still works.
old=$(chroot "$root" env -i HOME=/root PATH=/venv-min/bin:/usr/bin:/bin sh -c \
  "cd /work && python -c 'import torch, rankscope.torch; print(\"torch\", torch.__version__)'" 2>&1) || fail "under the oldest torch: $old"
[[ $(grep -c "using Python hooks for DDP because it was built against torch" <<<"$old") == 1 ]] ||
  fail "under the oldest torch the fallback was not said once: $old"
echo "check_binary_wheel: ok ($(basename "$wheel"), auditwheel: $verdict; DDP example and triage in a clean Debian 12; $(grep -oE '^torch [0-9.]+[^ ]*$' <<<"$old"): Python hooks, said once)"
