#!/bin/bash
# A/B of one host transfer (HostTransferBench): jars built before and after a change, alternated,
# same arguments; prints each run's JSON line.
# usage: scripts/host-ab.sh ROUNDS "HOST_TRANSFER_BENCH_ARGS" NAME=JAR [NAME=JAR ...]
#   e.g. scripts/host-ab.sh 6 "32768 8192 7 cma contiguous" before=/tmp/a.jar after=cli/target/kvferry.jar
echo "# script ($0):"; sed 's/^/#   /' "$0"
rounds=$1; args=$2; shift 2
for r in $(seq 1 "$rounds"); do
  for v in "$@"; do
    name=${v%%=*}; jar=${v#*=}
    echo "== $name round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) jar sha1 $(sha1sum "$jar" | cut -c1-12)"
    # shellcheck disable=SC2086 # the arguments are one string of words
    java -cp "$jar" dev.kvferry.bench.host.HostTransferBench $args 2>&1 | tail -1
  done
done
