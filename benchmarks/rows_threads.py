"""One node of the HPC layout: the parallel row kernel over threads, and simulate() per layout.

    python benchmarks/rows_threads.py [--threads 1,2,4,8,16] [--n 65536] [--json out.json]

1. ``kernels.rows.row_forces`` (float32): one target tile of ``n / 4`` bodies against ``n``
   sources in 4 tiles, for each thread count: interactions per second, the speed-up over one
   thread, and a check that every thread count gives bit-identical partials.
2. ``simulate()`` at N = ``n`` (float32, snapshots every 10 steps, differential timing) on one
   in-process worker: ``layout="rows"`` (one Dask thread, the kernel on every core) against
   ``layout="pairs"`` (a Dask thread per core, the symmetric kernel), as on one node.

This is the calibration of the model's kernel term (``docs/scaling.md``) on a many-core
machine; the device machine (16 cores) is one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def kernel_scaling(n: int, threads: list[int], reps: int = 3) -> list[dict]:
    from nbody_dask.kernels import rows

    rng = np.random.default_rng(0)
    pos = rng.normal(size=(3, n)).astype(np.float32)
    mass = np.full(n, 1 / n, dtype=np.float32)
    starts = np.linspace(0, n, 5).astype(np.int64)
    target = pos[:, : n // 4].copy()
    eps2 = np.float32(1e-4)
    rows.row_forces(*target, *pos, mass, starts, eps2, False, 0)  # compile
    out, reference = [], None
    for t in threads:
        rows.set_threads(t)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            result = rows.row_forces(*target, *pos, mass, starts, eps2, False, 0)
            best = min(best, time.perf_counter() - start)
        if reference is None:
            reference = result
        identical = bool(np.array_equal(result, reference))
        rate = target.shape[1] * n / best / 1e9
        out.append({"threads": t, "seconds": best, "gint_s": rate, "identical": identical})
        print(f"row kernel, {t:>2} threads: {rate:7.2f} Gint/s, speed-up "
              f"{rate / out[0]['gint_s']:.2f}, bit-identical to 1 thread: {identical}",
              flush=True)
    return out


def simulate_layouts(n: int, cores: int) -> dict:
    import dask
    from distributed import Client, LocalCluster

    import nbody_dask

    bodies = nbody_dask.plummer(n, seed=0)
    results = {}
    for layout, threads in (("pairs", cores), ("rows", 1)):
        with LocalCluster(n_workers=1, threads_per_worker=threads, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client, \
                dask.config.set({"nbody.kernel-threads": cores}):
            def run(steps, layout=layout):
                start = time.perf_counter()
                nbody_dask.simulate(bodies, steps=steps, dt=1 / 256, softening=0.01,
                                    dtype="float32", snapshot_every=10, layout=layout,
                                    backend="cpu",
                                    client=client, progress=False)
                return time.perf_counter() - start

            run(2)
            short, long = run(10), run(30)
            per_step = (long - short) / 20
            results[layout] = {"s_per_step": per_step, "gint_s": n * n / per_step / 1e9}
            print(f"simulate N={n} {layout}: {per_step:.3f} s/step, "
                  f"{n * n / per_step / 1e9:.1f} Gint/s (N² counted)", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--threads", default=",".join(
        str(t) for t in (1, 2, 4, 8, 16, 32) if t <= cores))
    parser.add_argument("--n", type=int, default=65_536)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    print(f"{cores} cores", flush=True)
    result = {"cores": cores,
              "kernel": kernel_scaling(args.n, [int(t) for t in args.threads.split(",")]),
              "simulate": simulate_layouts(args.n, cores)}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
