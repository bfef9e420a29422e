# Call 1 of the session of 2026-12-05 (afternoon): the graph tests on the latest Python, then READ's
# early done (the thread completing the last read reports the request) against the node classes of
# dd9fa4f, two rounds alternated, with D's stamps.
set -u
F="--heads 32 --kv-heads 8 --head-dim 128 --intermediate 14336 --num-blocks 4096 --chunk-tokens 2048 --no-mla-probe"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader > $OUT/gpu.txt 2>&1
nproc >> $OUT/gpu.txt
t0=$(date +%s)
timeout 150 bash scripts/gpu-pytest.sh -v python/tests/test_gpu_model.py -k graph > $OUT/graphs-pytest.txt 2>&1
echo "pytest rc=$? wall=$(( $(date +%s) - t0 ))" >> $OUT/gpu.txt
KVFERRY_SAVE_MARKS=step KVFERRY_NODE_JAVA_OPTS=-Dkvferry.stamps=true AB_TIMEOUT=110 KVFERRY_PORT_BASE=41000 \
  OUT=/tmp/w/readab timeout 440 bash scripts/gpu-model-ab.sh 2 0 0 before=.device/ab/old-actors.jar after= -- \
  --modes read $F --no-generate --ttft-lengths 1024 --ttft-reps 40 --ttft-warmup 200 --prompts 0 \
  --ttft-baseline-idle-steps-ms 20 > $OUT/readab-console.txt 2>&1
echo "ab rc=$? wall=$(( $(date +%s) - t0 ))" >> $OUT/gpu.txt
cp /tmp/w/readab.tgz $OUT/ 2>/dev/null
ls /tmp/w >> $OUT/gpu.txt
