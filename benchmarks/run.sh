#!/usr/bin/env bash
# The benchmark set quoted in the README (about 10 minutes on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results
out="benchmarks/results/$(date +%F)-$(hostname -s).json"
nbody-dask bench --n 16384 --n 65536 --n 262144 --steps 20 \
    --strong 65536 --weak 32768 --workers "1,$(nproc)" --json "$out" "$@"
python benchmarks/memory.py --n 1048576 --workers "$(nproc)"
echo "wrote $out"
