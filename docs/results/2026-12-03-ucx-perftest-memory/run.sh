#!/usr/bin/env bash
# ucx_perftest ucp_put_bw over UCX_TLS=sm between two processes on loopback, with the memory
# allocated by UCX (its default, UCX_ALLOC_PRIO's md:sysv first) or by the process (heap, mmap),
# at 32 KiB puts, and with the default at one 64 MiB message (the bench's batch, out of cache).
# Prints each run's Final: line (overall MB/s, UCX's MB = 2^20 bytes, is the 6th number).
set -u
port=${PORT:-13500}
run() { # ALLOC_PRIO SIZE ITERATIONS
  port=$((port + 1))
  env UCX_TLS=sm ${1:+UCX_ALLOC_PRIO=$1} ucx_perftest -p "$port" >/dev/null 2>&1 &
  sleep 1
  printf 'alloc=%-8s size=%-9s ' "${1:-default}" "$2"
  env UCX_TLS=sm ${1:+UCX_ALLOC_PRIO=$1} ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s "$2" \
    -n "$3" -w $(( $3 / 10 )) 2>&1 | grep -E '^Final|ERROR' || echo "(no Final line)"
  wait
}
echo "# $(date -u) $(ucx_info -v | head -1)"
echo "#                                iterations  50%ile  average  overall(us)  MB/s avg  MB/s overall  msg/s avg  msg/s overall"
for round in 1 2; do
  for alloc in "" heap mmap; do run "$alloc" 32768 20480; done
  run "" 67108864 15
done
