#!/usr/bin/env bash
# Session 2026-12-05 (fourth), small call: the GPU JUnit classes (CudaTransport's done-word store
# and hint), then the check with 12 prompts per mode.
set -u
nvidia-smi -L > $OUT/gpu.txt 2>&1
t0=$(date +%s)
(OUT=$OUT timeout 100 bash scripts/gpu-junit.sh > $OUT/junit-console.txt 2>&1; echo "junit rc=$? wall=$(( $(date +%s) - t0 ))s" >> $OUT/junit-console.txt)
t1=$(date +%s)
(OUT=$OUT/model KVFERRY_PORT_BASE=27820 timeout 140 bash scripts/gpu-model.sh 0 0 --prompts 12 \
   --mode-budget-s 50 --generate-every 10 --control-every 4 --ttft-lengths "" --no-mla-probe \
   > $OUT/model-console.txt 2>&1; echo "model rc=$? wall=$(( $(date +%s) - t1 ))s" >> $OUT/model-console.txt)
tail -8 $OUT/junit-console.txt; grep -h "SUMMARY\|blocks at end\|LEAK" $OUT/model-console.txt; tail -2 $OUT/model-console.txt
