"""The embedded default cluster: in-process threads (today) against worker processes (before).

    python benchmarks/embedded_default.py [--n 4096 --n 16384 --n 65536] [--reps 3]

simulate() steady state (``benchmark.simulate_rate``: differential timing, snapshots every
10 steps) on ``clusters.local()`` and on ``clusters.local(processes=True)``, alternating, each
the best of ``--reps``. float32, all cores. Prints a table of seconds per step and the ratio.
"""

from __future__ import annotations

import argparse

from distributed import Client

from nbody_dask import benchmark, clusters


def seconds_per_step(n: int, processes: bool, reps: int) -> float:
    steps = 30 if n < 65_536 else 20
    with clusters.local(processes=processes) as cluster, Client(cluster) as client:
        rate = benchmark.simulate_rate(n, steps=steps, snapshot_every=10, dtype="float32",
                                       client=client, reps=reps)
    return rate["seconds_per_step_min"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", default=None)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print("| N | in-process threads (s/step) | worker processes (s/step) | threads / processes |")
    print("|---|---|---|---|")
    for n in args.n or (4096, 16_384, 65_536):
        threads = seconds_per_step(n, False, args.reps)
        procs = seconds_per_step(n, True, args.reps)
        print(f"| {n:,} | {threads:.4f} | {procs:.4f} | {threads / procs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
