#!/bin/bash
# A/B of one bench suite: jars built before and after a change (or one jar with JVM options per
# variant), alternated, same flags; prints each run's rows and notes.
# usage: scripts/bench-ab.sh SUITE ROUNDS NAME=JAR[@JVM_OPTIONS] [NAME=JAR[@JVM_OPTIONS] ...]
#   e.g. scripts/bench-ab.sh e2e 3 before=/tmp/a.jar after=cli/target/kvferry.jar
# KVFERRY_HOME_<NAME> (optional, per variant): the checkout whose python/ that variant's port
# suite runs, for an A/B of the Python client too (passed as KVFERRY_PYTHON_PATH). Without it
# the suite finds python/ three folders above the jar (cli/target/kvferry.jar of a checkout),
# else in this folder.
echo "# script ($0):"; sed 's/^/#   /' "$0"
suite=$1; rounds=$2; shift 2
export KVFERRY_HOME=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq 1 "$rounds"); do
  for v in "$@"; do
    name=${v%%=*}; jar=${v#*=}; opts=""
    case $jar in *@*) opts=${jar#*@}; jar=${jar%%@*} ;; esac
    echo "== $name round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) jar sha1 $(sha1sum "$jar" | cut -c1-12)${opts:+ options $opts}"
    home_var=KVFERRY_HOME_$name
    [ -z "${!home_var:-}" ] || echo "   python/ from ${!home_var}"
    # shellcheck disable=SC2086 # the options are one string of words
    env KVFERRY_HOME="${!home_var:-$KVFERRY_HOME}" ${!home_var:+KVFERRY_PYTHON_PATH="${!home_var}/python"} \
      java $opts -cp "$jar" dev.kvferry.cli.KvferryCli bench --only "$suite" 2>/dev/null | grep -v '^{'
  done
done
