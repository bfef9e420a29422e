#!/usr/bin/env bash
# Runs the real-model check's CPU case (python/tests/test_gpu_model.py, llama on the CPU through
# real nodes over cma) N times and prints, per run, the model's source, whether every check passed,
# and per request count: D's transferred KV still P's after decoding, the engine without kvferry's
# KV equal to P's, first-token logits bitwise equal. For a check that failed once (docs/gpu.md,
# "The real-model check in CI").
#
# usage: scripts/model-check-repeat.sh [N]   (default 10; needs torch, java and the jar)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-10}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "$(date -u '+%F %T') UTC, commit $(git -C "$root" rev-parse --short HEAD), $(nproc) CPUs, torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
for i in $(seq 1 "$n"); do
  (cd "$root/python" && KVFERRY_JAR=${KVFERRY_JAR:-$root/cli/target/kvferry.jar} PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} \
    PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/test_gpu_model.py \
    -k "bit_identical and cpu and llama" --basetemp="$work/b$i" > "$work/r$i.txt" 2>&1)
  rc=$?
  report=$(find "$work/b$i" -name report.json | head -1)
  /usr/bin/python3 - "$i" "$rc" "$report" <<'PY'
import json, sys
i, rc, path = sys.argv[1], sys.argv[2], sys.argv[3]
if not path:
    print(f"run {i}: pytest rc {rc}, no report")
    sys.exit()
r = json.load(open(path))
reqs = [q for m in r["modes"] for q in m["requests"] if "error" not in q and q["kind"] != "abort"]
def count(pred):
    return sum(1 for q in reqs if pred(q))
after = lambda q, k: q.get("cache_after_decode", {}).get(k)
print(f"run {i}: pytest rc {rc}, model {r.get('model_source')}, all checks passed {r['summary']['all_ok']}; "
      f"of {len(reqs)} requests: D's KV still P's after decoding {count(lambda q: after(q, 'd_kv_still_p') is True)}, "
      f"baseline's KV equal to P's {count(lambda q: after(q, 'baseline_kv_is_p') is True)}, "
      f"first-token logits bitwise equal {count(lambda q: q['first_logits_bitwise_equal'])}")
if r["summary"]["all_ok"] is not True:
    for line in r["summary"]["lines"]:
        print("  " + line)
PY
done
