#!/bin/bash
# The planner suite through the launcher (./kvferry, with its class-data archive), default JVM
# options against -XX:+AlwaysPreTouch, alternated. (The launcher now adds -XX:+AlwaysPreTouch to
# `bench` itself; KVFERRY_BENCH_PRETOUCH=0 turns that off, as the first variant here needs.)
cd "$(dirname "$0")/.."
echo "# planner suite via ./kvferry bench --only planner, $(git rev-parse --short HEAD), alternated; KVFERRY_JAVA_OPTS per run"
for r in 1 2 3 4 5; do
  for o in "" "-XX:+AlwaysPreTouch"; do
    echo "== round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) KVFERRY_JAVA_OPTS='$o'"
    KVFERRY_BENCH_PRETOUCH=0 KVFERRY_JAVA_OPTS="$o" ./kvferry bench --only planner 2>/dev/null | grep -E "^planner [0-9]"
  done
done
