#!/bin/bash
# Is one layer's cma write slower when the engine has just written the layer on another core?
# The e2e budget's copy (one 2,048-token layer: 256 blocks of 32 KiB out of a pool of 512, 201
# rounds, destinations rotating over 8 pools), with and without another thread writing the source
# again before each round (--rewrite-source), on 1 and 2 copy threads.
# usage: scripts/rewrite-source-ab.sh [ROUNDS] [JAR]
rounds=${1:-3}
jar=${2:-cli/target/kvferry.jar}
for r in $(seq 1 "$rounds"); do
  echo "== round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  for threads in 1 2; do
    for rewrite in false true; do
      echo "copy threads $threads, rewrite source $rewrite: $(java -XX:+AlwaysPreTouch \
        -Dkvferry.bench.cma-copy-threads=$threads \
        -cp "$jar" dev.kvferry.bench.host.HostTransferBench 32768 256 201 cma scattered \
        --destination-slots=8 $([ $rewrite = true ] && echo --rewrite-source) 2>/dev/null)"
    done
  done
done
