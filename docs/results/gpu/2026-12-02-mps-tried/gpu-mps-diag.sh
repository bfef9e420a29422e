#!/usr/bin/env bash
set +e
export CUDA_MPS_PIPE_DIRECTORY=/tmp/kvferry-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/kvferry-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
# 1. torch alone: a CUDA tensor shared with a child process (CUDA IPC) under MPS
timeout 60 python3 - > $OUT/ipc-torch.txt 2>&1 <<'PY'
import torch, torch.multiprocessing as mp
def child(t, q):
    q.put(float(t.sum().item()))
if __name__ == "__main__":
    mp.set_start_method("spawn")
    t = torch.ones(1024, device="cuda")
    q = mp.Queue(); p = mp.Process(target=child, args=(t, q)); p.start()
    print("child saw sum", q.get(timeout=30)); p.join(); print("torch IPC under MPS: ok")
PY
echo "rc=$?" >> $OUT/ipc-torch.txt
# 2. the model check, short, logs kept
mkdir -p /tmp/diag
OUT=/tmp/diag KVFERRY_PORT_BASE=27900 timeout 75 bash scripts/gpu-model.sh 0 0 --prompts 1 --mode-budget-s 20 --ttft-lengths 1024 --ttft-reps 1 --ttft-warmup 0 --no-mla-probe > $OUT/model-mps.txt 2>&1
echo "rc=$?" >> $OUT/model-mps.txt
echo quit | nvidia-cuda-mps-control; sleep 2
d=/tmp/diag/gpu-model-p0-d0
tail -60 $d/prefill.log > $OUT/prefill-tail.txt 2>&1
tail -60 $d/decode.log > $OUT/decode-tail.txt 2>&1
cp $d/console.txt $OUT/console.txt 2>/dev/null
tail -40 $CUDA_MPS_LOG_DIRECTORY/server.log > $OUT/mps-server-log.txt 2>&1
cat $OUT/ipc-torch.txt | tail -5; tail -5 $OUT/model-mps.txt; tail -8 $OUT/prefill-tail.txt | cut -c1-250; tail -8 $OUT/decode-tail.txt | cut -c1-250; tail -10 $OUT/mps-server-log.txt | cut -c1-250
