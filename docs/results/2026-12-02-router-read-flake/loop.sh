#!/bin/bash
cd /work/main/python
export KVFERRY_JAR=/work/main/cli/target/kvferry.jar PYTHONPATH=/work/main/python PYTHONDONTWRITEBYTECODE=1 KVFERRY_LOG_LEVEL=DEBUG
for i in $(seq 1 ${N:-8}); do
  ( yes > /dev/null & yes > /dev/null & sleep 40; kill %1 %2 ) &
  start=$(date +%s)
  /usr/bin/python3 -m pytest -q -p no:cacheprovider -rw "tests/test_router_proxy.py::test_read_mode_and_an_engine_that_dies_mid_request" > /tmp/flake/run$i.log 2>&1
  echo "run $i rc=$? $(( $(date +%s) - start ))s $(grep -c 'still holds' /tmp/flake/run$i.log)" >> /tmp/flake/summary.txt
  wait
done
