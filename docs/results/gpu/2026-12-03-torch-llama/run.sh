#!/usr/bin/env bash
# One device call (from the repository root, .device/ from scripts/gpu-bundle.sh carried):
#   bash docs/results/gpu/2026-12-03-torch-llama/run.sh
# 1. python/tests/test_gpu_model.py on the GPU host (transformers present: its Llama and MLA,
#    CPU and CUDA cases);
# 2. the same tests with transformers hidden (a package named transformers that raises
#    ImportError first on PYTHONPATH), so kvferry.torch_llama's Llama runs on CUDA too;
# 3. the real-model check, both modes, P and D on GPU 0, the shipped defaults.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out/check"
nvidia-smi -L > "$out/gpu.txt" 2>&1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$out/gpu.txt" 2>&1
timeout 240 bash scripts/gpu-pytest.sh python/tests/test_gpu_model.py > "$out/pytest-transformers.txt" 2>&1
echo "rc=$?" >> "$out/pytest-transformers.txt"
hide=$(mktemp -d)
mkdir -p "$hide/transformers"
echo 'raise ImportError("transformers hidden for this run")' > "$hide/transformers/__init__.py"
PYTHONPATH=$hide timeout 240 bash scripts/gpu-pytest.sh python/tests/test_gpu_model.py > "$out/pytest-torch-llama.txt" 2>&1
echo "rc=$?" >> "$out/pytest-torch-llama.txt"
F="--heads 32 --kv-heads 8 --head-dim 128 --intermediate 14336 --num-blocks 4096 --chunk-tokens 2048 --no-mla-probe --no-generate"
OUT=$out/check KVFERRY_PORT_BASE=39000 timeout 200 bash scripts/gpu-model.sh 0 0 --prompts 10 --ttft-lengths "" $F > "$out/check/console.txt" 2>&1
echo "rc=$?" >> "$out/check/console.txt"
