#!/bin/bash
# Where the CPUs go between the last layer's event and D done in the e2e bench's paced row:
# runs `kvferry bench --only e2e` with the stages file, traces the scheduler for 6 s of the paced
# measurement (perf sched, CLOCK_MONOTONIC like System.nanoTime) and sums per thread the time
# each ran inside each request's window (scripts/e2e-cpu-window.py). Needs perf and root.
# usage: scripts/e2e-cpu-window.sh [JAR]
set -euo pipefail
jar=${1:-cli/target/kvferry.jar}
work=$(mktemp -d)
java -XX:+AlwaysPreTouch -Dkvferry.e2e.stages-file="$work/stages.csv" -cp "$jar" \
  dev.kvferry.cli.KvferryCli bench --only e2e > "$work/bench.txt" 2>&1 &
bench=$!
for _ in $(seq 1 180); do
  sleep 1
  grep -q "2 ms layers" "$work/bench.txt" && break
done
sleep 2
perf sched record -k CLOCK_MONOTONIC -o "$work/sched.data" -- sleep 6 > /dev/null 2>&1
wait $bench
perf sched timehist -i "$work/sched.data" > "$work/timehist.txt" 2>/dev/null
grep -E "^e2e" "$work/bench.txt"
grep "2 ms layers:" "$work/bench.txt" | sed 's/.*stages, median us after its event: /  paced stages: /'
python3 "$(dirname "$0")/e2e-cpu-window.py" "$work/timehist.txt" "$work/stages.csv"
rm -rf "$work"
