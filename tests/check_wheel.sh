#!/usr/bin/env bash
# `pip wheel .` makes a wheel that holds the whole package: the extension, the
# runtime libraries it loads ($ORIGIN), the Python files, and the `rankscope`
# command as an entry point. Reuses the build directory of `pip install .`.
set -euo pipefail
python=$1 out=$2
rm -rf "$out"
"$python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$out" .
whl=$(ls "$out"/rankscope-*.whl)
list=$("$python" -m zipfile -l "$whl")
for f in rankscope/__init__.py rankscope/torch.py rankscope/_run_identity.py rankscope/_replicas.py rankscope/_amp.py rankscope/_readback.py rankscope/_late_scalars.py rankscope/_build_info.py \
         rankscope/librankscope.so rankscope/py.typed; do
  grep -q " *$f " <<<"$list" || { echo "check_wheel: $f missing from $whl"; exit 1; }
done
grep -qE "rankscope/_rankscope\.cpython-[0-9]+-[^ ]+\.so" <<<"$list" || { echo "check_wheel: no extension in $whl"; exit 1; }
! grep -qE "\.so\.[0-9]* " <<<"$list" || { echo "check_wheel: a library under a versioned name (a copy) in $whl:
$(grep -E "\.so\.[0-9]* " <<<"$list")"; exit 1; }
"$python" -m zipfile -e "$whl" "$out/x" >/dev/null 2>&1 || "$python" -m zipfile -e "$whl" "$out/x"
grep -q '^rankscope = rankscope.__main__:main' "$out"/x/rankscope-*.dist-info/entry_points.txt ||
  { echo "check_wheel: no rankscope command in the wheel's entry points"; exit 1; }
echo "check_wheel: ok ($(basename "$whl"), $(grep -c . <<<"$list") files)"
