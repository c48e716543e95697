"""Peak memory per worker during one force evaluation at large N (issue target: N = 1,048,576
with peak RSS per worker < 1 GiB; no O(N^2) array anywhere).

    python benchmarks/memory.py --n 1048576 --workers 2
    python benchmarks/memory.py --n 4194304 --workers 2 --method tree
    python benchmarks/memory.py --n 16777216 --workers 2 --processes --box-size 1  # TreePM
    python benchmarks/memory.py --n 16777216 --workers 2 --processes --box-size 1 --lazy
    python benchmarks/memory.py --n 16777216 --workers 2 --processes --box-size 1 --lazy \
        --layout rows --json benchmarks/results/<date>-memory-treepm-rows.json

Starts a LocalCluster of single-threaded workers (with --processes, worker processes on the
loopback; without, threads of this process, as the default cluster), samples every worker's
resident set size (psutil) every 0.2 s while ``nbody_dask.accelerations`` runs, and prints
the peak per worker, the driver's peak and the time taken.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import psutil
from distributed import Client

import nbody_dask
from nbody_dask.clusters import local
from rss import PeakRSS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_048_576)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--method", default="direct", choices=["direct", "tree", "treepm"])
    parser.add_argument("--box-size", type=float, default=None,
                        help="a periodic box of uniform random bodies, by TreePM (its mesh "
                             "and slabs by default)")
    parser.add_argument("--lazy", action="store_true",
                        help="with --box-size: the bodies as Dask arrays made on the workers "
                             "(chunks of 1,048,576), never in the driver")
    parser.add_argument("--tile-size", type=int, default=None)
    parser.add_argument("--layout", default=None, choices=["pairs", "rows"])
    parser.add_argument("--mesh-slabs", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--processes", action="store_true",
                        help="worker processes (the default cluster's workers are threads of "
                             "this process: one RSS for all)")
    args = parser.parse_args()

    if args.box_size is None:
        bodies = nbody_dask.plummer(args.n, seed=0)
        periodic = {}
    elif args.lazy:
        import dask.array as da
        import xarray as xr

        chunk = 1_048_576
        position = da.random.default_rng(0).random((args.n, 3), chunks=(chunk, 3),
                                                   dtype=np.float32) * args.box_size
        bodies = xr.Dataset({"position": (("body", "axis"), position),
                             "velocity": (("body", "axis"), da.zeros_like(position)),
                             "mass": ("body", da.full(args.n, 1.0 / args.n, chunks=chunk,
                                                      dtype=np.float32))})
        periodic = dict(box_size=args.box_size, mesh_slabs=args.mesh_slabs)
        args.method = "treepm"
    else:
        rng = np.random.default_rng(0)
        position = rng.random((args.n, 3), dtype=np.float32) * args.box_size
        bodies = nbody_dask.make_bodies(position, np.zeros_like(position),
                                        np.full(args.n, 1.0 / args.n, dtype=np.float32))
        del position
        periodic = dict(box_size=args.box_size, mesh_slabs=args.mesh_slabs)
        args.method = "treepm"
    with local(n_workers=args.workers, threads_per_worker=1,
               processes=args.processes) as cluster, \
            Client(cluster) as client:
        pids = client.run(lambda: psutil.Process().pid)
        procs = {addr: psutil.Process(pid) for addr, pid in pids.items()}
        with PeakRSS(procs) as sampled:
            t0 = time.perf_counter()
            acc = nbody_dask.accelerations(bodies, 0.01 if not periodic else 0.0,
                                           dtype=args.dtype, client=client,
                                           method=args.method, tile_size=args.tile_size,
                                           layout=args.layout, **periodic)
            seconds = time.perf_counter() - t0
        peak = sampled.peak
    rate = f"{args.n**2 / seconds / 1e9:.2f} Gint/s; " if args.method == "direct" else ""
    print(f"N = {args.n:,}, {args.method}, {args.workers} workers, {args.dtype}: "
          f"{seconds:.1f} s, {rate}accelerations {acc.shape}")
    for addr, rss in peak.items():
        print(f"  peak RSS {rss / 2**20:7.1f} MiB  {addr}")
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"  peak RSS {driver / 2**10:7.1f} MiB  driver (bodies, gathered accelerations)")
    if args.json:
        import json
        import platform

        with open(args.json, "w") as f:
            json.dump({"arguments": vars(args), "machine": platform.processor() or
                       platform.machine(), "cores": psutil.cpu_count(), "seconds": seconds,
                       "worker_peak_mib": sorted(rss / 2**20 for rss in peak.values()),
                       "driver_peak_mib": driver / 2**10}, f, indent=1)


if __name__ == "__main__":
    main()
