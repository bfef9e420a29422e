#!/usr/bin/env bash
# A/B of a few node classes on the GPU in one device call: scripts/gpu-model.sh run ROUNDS times
# each way, alternately, "before" with the classes of BEFORE_JAR first on the nodes' classpath
# (KVFERRY_CP_FIRST; e.g. the changed classes as an earlier commit compiled them) and "after"
# with the bundle's kvferry.jar alone. The bundle holds one kvferry.jar; a second one would not
# fit the device machine's carry limit, a jar of the changed classes does.
#
# usage: OUT=DIR scripts/gpu-model-ab.sh ROUNDS BEFORE_JAR P_GPU D_GPU [kvferry.gpu_check flags]
# env:   AB_TIMEOUT   seconds per run (default 150); a run past it is cut, what it wrote stays
#        KVFERRY_PORT_BASE  the first run's base port; each later run adds 100
# Output: $OUT/<before|after>-<round>/ (gpu-model.sh's output and console.txt) and, when the
# nodes ran with -Dkvferry.stamps=true (KVFERRY_NODE_JAVA_OPTS), stamps.txt: the READ start
# stamps' medians per kind of transfer (scripts/read-stamps.py).
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: OUT=DIR $0 ROUNDS BEFORE_JAR P_GPU D_GPU [gpu_check flags]" >&2; exit 2; }
: "${OUT:?set OUT to the output folder}"
here=$(cd "$(dirname "$0")" && pwd)
rounds=$1 before_jar=$(cd "$(dirname "$2")" && pwd)/$(basename "$2") P=$3 D=$4
shift 4
[ -f "$before_jar" ] || { echo "no such jar: $before_jar" >&2; exit 2; }
port=${KVFERRY_PORT_BASE:-27000}
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$OUT/$side-$round
    mkdir -p "$dir"
    first=
    [ "$side" = before ] && first=$before_jar
    echo "== $side, round $round, port base $port, $(date -u +%H:%M:%S)"
    start=$SECONDS
    OUT=$dir KVFERRY_PORT_BASE=$port KVFERRY_CP_FIRST=$first timeout "${AB_TIMEOUT:-150}" \
      bash "$here/gpu-model.sh" "$P" "$D" "$@" > "$dir/console.txt" 2>&1
    echo "   rc=$? wall $((SECONDS - start)) s"
    grep -E "^TTFT|checks|passed|FAIL" "$dir/console.txt" | head -20
    log=$dir/gpu-model-p$P-d$D/decode.log
    if [ -f "$log" ] && grep -q "read start stamps" "$log"; then
      for m in ttft-warm ttft-read-1024- ttft-read-4096- ""; do
        python3 "$here/read-stamps.py" ${m:+--match "$m"} "$log"
      done > "$dir/stamps.txt"
      grep -E "transfers:|layer0_queued|last_queued" "$dir/stamps.txt"
    fi
    port=$((port + 100))
  done
done
