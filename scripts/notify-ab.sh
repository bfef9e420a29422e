#!/bin/bash
# A/B of the notify round trip: jars built before and after a change, alternated, same flags.
# usage: scripts/notify-ab.sh ROUNDS ROUND_TRIPS NAME=JAR[@JVM_OPTIONS] [NAME=JAR[@JVM_OPTIONS] ...]
#   JVM_OPTIONS (space-separated) go to that variant only, e.g. b=kvferry.jar@-Dpekko.x=1;
#   -Dpekko.* and -XX: options reach the bench's echo JVM too.
echo "# script ($0):"; sed 's/^/#   /' "$0"
rounds=$1; rt=$2; shift 2
export KVFERRY_HOME=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq 1 $rounds); do
  for v in "$@"; do
    name=${v%%=*}; jar=${v#*=}; opts=""
    case $jar in *@*) opts=${jar#*@}; jar=${jar%%@*} ;; esac
    echo "== $name round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) jar sha1 $(sha1sum $jar | cut -c1-12)${opts:+ options $opts}"
    java ${AB_JAVA_OPTS:-} $opts -cp "$jar" dev.kvferry.cli.KvferryCli bench --only notify --round-trips $rt 2>/dev/null \
      | grep -E "round trip p|decode JVM CPU" | sed 's/RemoteBlocks.*JVMs;//'
  done
done
