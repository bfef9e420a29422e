#!/bin/bash
# usage: scripts/port-node-profile.sh JAR PYTHONDIR  -> node's hottest frames (top of stack) during 2 bench_port runs at 256 new
jar=$1; py=$2; d=$(mktemp -d)
java -XX:StartFlightRecording=filename=$d/rec.jfr,settings=profile -cp "$jar" dev.kvferry.cli.KvferryCli node --role prefill --engine-id bench-port --engine port --engine-socket $d/port.sock --port 25531 --management-port 25598 > $d/node.log 2>&1 &
pid=$!
for i in $(seq 1 90); do [ -S $d/port.sock ] && break; sleep 1; done
for i in 1 2; do (cd $py && PYTHONPATH=$PWD /usr/bin/python3 -m kvferry.bench_port --socket $d/port.sock --new 256 --steps 400 --round-trips 100); done
jcmd $pid JFR.dump filename=$d/rec.jfr > /dev/null
echo "top frames of the node's execution samples (count, frame):"
jfr print --events jdk.ExecutionSample $d/rec.jfr | grep -A1 "stackTrace = \[" | grep -v "stackTrace\|^--" | awk '{$1=$1};1' | sort | uniq -c | sort -rn | head -15
echo "samples in all: $(jfr summary $d/rec.jfr | awk '/jdk.ExecutionSample/{print $2}')"
kill $pid; wait $pid 2>/dev/null; rm -rf $d
