#!/usr/bin/env bash
# Runs Python tests on a GPU host that has torch, transformers and pytest but no Java (the tests
# CI skips there: python/tests/test_gpu_model.py by default). The bundle's Java goes on PATH for
# the tests that start nodes, its jar is KVFERRY_JAR, and every JVM gets the CUDA library paths
# through JAVA_TOOL_OPTIONS.
#
# usage (from the repository root, with .device/ from scripts/gpu-bundle.sh):
#   scripts/gpu-pytest.sh [pytest arguments]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GPU_ENV_WORK=$(mktemp -d)
trap 'rm -rf "$GPU_ENV_WORK"' EXIT
source "$here/gpu-env.sh"
PATH=$(dirname "$JAVA"):$PATH
export PATH KVFERRY_JAR=$CP JAVA_TOOL_OPTIONS="${CUDA_PROPS[*]}"
cd "$here/.."
[ $# -gt 0 ] || set -- python/tests/test_gpu_model.py
PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -p no:cacheprovider -rs "$@"
