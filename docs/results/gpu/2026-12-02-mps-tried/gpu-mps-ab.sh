#!/usr/bin/env bash
# TTFT with and without MPS: P's engine and P's node (and D's) on one GPU as separate processes.
set +e
start=$(date +%s)
echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)"
nvidia-smi -q | grep -i -m2 "compute mode\|MIG Mode" 
args="--prompts 2 --mode-budget-s 30 --generate-every 10 --control-every 4 --ttft-lengths 1024,4096 --ttft-reps 9 --ttft-warmup 300 --no-mla-probe"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/kvferry-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/kvferry-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
for run in nomps-1 mps-1 nomps-2 mps-2; do
  if [ $(( $(date +%s) - start )) -gt 380 ]; then echo "== $run skipped (time)"; continue; fi
  case $run in
    mps-*) nvidia-cuda-mps-control -d; sleep 1;;
  esac
  echo "== $run at $(date -u +%T)"
  KVFERRY_PORT_BASE=27820 timeout 170 bash scripts/gpu-model.sh 0 0 $args > $OUT/$run.txt 2>&1
  echo "rc=$?" >> $OUT/$run.txt
  case $run in
    mps-*) echo "mps servers: $(echo get_server_list | nvidia-cuda-mps-control)" >> $OUT/$run.txt
           echo quit | nvidia-cuda-mps-control; sleep 2;;
  esac
  grep -E "^TTFT|TTFT (write|read) n=.*medians|^SUMMARY" $OUT/$run.txt | cut -c1-330
done
cat $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null | tail -5 > $OUT/mps-control-log.txt
