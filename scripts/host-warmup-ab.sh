#!/bin/bash
# A/B of the host bench's warm-up: 3 rounds only (warmup-ms=0) against at least 500 ms, 512 tokens
# (2,048 blocks of 32 KiB), 7 timed rounds each as in kvferry bench; the memcpy peer beside them.
J=cli/target/kvferry.jar
cc -O2 -o /tmp/memcpy_ceiling bench/src/main/resources/dev/kvferry/bench/peers/memcpy_ceiling.c
for r in 1 2 3; do
  echo "== round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "memcpy_ceiling 32768 2048 7 4096: $(/tmp/memcpy_ceiling 32768 2048 7 4096)"
  for layout in contiguous scattered; do
    for t in cma tcp; do
      for w in 0 500; do
        echo "$t $layout warmup-ms=$w: $(java -XX:+AlwaysPreTouch -Dkvferry.bench.warmup-ms=$w -cp $J dev.kvferry.bench.host.HostTransferBench 32768 2048 7 $t $layout 2>/dev/null)"
      done
    done
  done
done
