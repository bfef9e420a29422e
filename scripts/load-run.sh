#!/usr/bin/env bash
# The router proxy's load run: router + 2 P + 2 D nodes with reference engines, wrk, Prometheus.
# Needs the jar (./kvferry --help builds it), wrk and prometheus (Debian packages).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec /usr/bin/python3 "$root/scripts/load/load_run.py" "$@"
