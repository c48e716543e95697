#!/usr/bin/env bash
# The benchmark set quoted in the README (about 20 minutes on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results
out="benchmarks/results/$(date +%F)-$(hostname -s).json"
nbody-dask bench --n 16384 --n 65536 --steps 30 --reps 3 \
    --strong 65536 --weak 32768 --workers "1,$(nproc)" --json "$out" "$@"
nbody-dask bench --n 262144 --steps 20 --no-kernel-sweep --json "${out%.json}-262144.json" "$@"
python benchmarks/memory.py --n 1048576 --workers "$(nproc)"
echo "wrote $out"
