#!/usr/bin/env bash
# Session 2026-12-05 (fourth), call 2: WRITE at 4,096 tokens, D's wait starting at once against
# only after P's prefill returned (--ttft-d-after-p), alternated twice; one mark per step, graphs.
set -u
nvidia-smi -L > $OUT/gpu.txt 2>&1
F="--heads 32 --kv-heads 8 --head-dim 128 --intermediate 14336 --num-blocks 4096 --chunk-tokens 2048 --no-mla-probe"
C="--modes write $F --no-generate --ttft-lengths 4096 --ttft-reps 30 --ttft-warmup 200 --prompts 0"
port=27900
for round in 1; do
  for v in plain dafter; do
    extra=""; [ $v = dafter ] && extra="--ttft-d-after-p"
    t=$(date +%s)
    KVFERRY_SAVE_MARKS=step OUT=$OUT/$v-$round KVFERRY_PORT_BASE=$port timeout 100 \
      bash scripts/gpu-model.sh 0 0 $C $extra > $OUT/$v-$round-console.txt 2>&1
    echo "$v-$round rc=$? wall=$(( $(date +%s) - t ))s" | tee -a $OUT/runs.txt
    port=$((port + 100))
  done
done
grep -h "TTFT\|added (matched)\|first token, added" $OUT/*-console.txt | head -40
