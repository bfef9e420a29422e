#!/bin/bash
# e2e bench on the device host's CPUs: 2 CPUs (taskset, as on the project's VM) and 16, the jar
# before (base: its classes first on the classpath) and after the done-word bell and direct issue;
# last, 16 CPUs with the layer copies shared by 4 threads instead of 2.
here=$(cd "$(dirname "$0")" && pwd)
export GPU_ENV_WORK=$(mktemp -d)
source "$here/gpu-env.sh"
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), java $($JAVA -version 2>&1 | head -1)"
for spec in ${SPECS:-"2:base" "2:new" "16:base" "16:new" "16:new:4"}; do
  IFS=: read -r cores v threads <<< "$spec"
  cp=$CP; [ "$v" = base ] && cp=$here/base-classes.jar:$CP
  echo "== $v, CPUs 0-$((cores-1)), copy threads ${threads:-2 (default)}, $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 170 taskset -c 0-$((cores-1)) $JAVA -XX:+AlwaysPreTouch ${threads:+-Dkvferry.bench.cma-copy-threads=$threads} \
    -cp "$cp" dev.kvferry.cli.KvferryCli bench --only e2e 2>&1 \
    | grep -E '^e2e|2 ms layers:|2,048 tok: layers' | sed 's/; goal: added.*//; s/.*stages, median us after its event: /  paced stages: /'
done
