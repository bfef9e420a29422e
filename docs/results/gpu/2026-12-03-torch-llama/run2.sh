#!/usr/bin/env bash
# Second device call: the CPU case that failed in run.sh's second step (kvferry.torch_llama's
# Llama on the CPU, torch 2.11, transformers hidden), four times, with gpu_check's new
# diagnostics (D's transferred KV read again after decoding; the baseline's KV against P's), then
# the same case with transformers' Llama four times. Per run: each request's checks.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
hide=$(mktemp -d)
mkdir -p "$hide/transformers"
echo 'raise ImportError("transformers hidden for this run")' > "$hide/transformers/__init__.py"
show() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("  model:", r.get("model_source"))
for m in r["modes"]:
    for q in m["requests"]:
        a = q.get("cache_after_decode", {})
        print("  ", m["mode"], q.get("request"), "n", q.get("prompt_tokens"), "kv_equal", q.get("kv_equal"),
              "first_logits_equal", q.get("first_logits_bitwise_equal"), "d_kv_still_p", a.get("d_kv_still_p"),
              "baseline_kv_is_p", a.get("baseline_kv_is_p"), "cache_after_equal", a.get("equal"))
for line in r["summary"]["lines"]:
    print("  " + line)
PY
}
for variant in ${VARIANTS:-torch-llama transformers}; do
  for i in $(seq 1 ${RUNS:-4}); do
    base=$(mktemp -d)
    if [ $variant = torch-llama ]; then pp=$hide; else pp=; fi
    PYTHONPATH=$pp timeout 100 bash scripts/gpu-pytest.sh python/tests/test_gpu_model.py -k "bit_identical and cpu and llama" \
      --basetemp="$base" > "$out/$variant-$i.txt" 2>&1
    echo "rc=$?" >> "$out/$variant-$i.txt"
    for f in $(find "$base" -name report.json); do show "$f" >> "$out/$variant-$i.txt" 2>&1; done
  done
done
