"""The driver's memory when a run starts from a lazy body set against the same bodies in
memory: what ``simulate`` holds of a large box that never passes through one process.

    python benchmarks/lazy_start.py --n 4194304 --workers 2 [--steps 1] [--json out.json]

Uniform random bodies in a periodic unit box (float64 Dask arrays made chunk by chunk on the
workers, or the same arrays computed into the driver first), a TreePM run of ``--steps``
steps to a Zarr store on a LocalCluster of worker processes on the loopback. Prints the
driver's peak resident set size above its level before the bodies were made, each run's
wall time, and whether the two trajectories are bit-identical.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import dask.array as da
import numpy as np
import psutil
import xarray as xr
from distributed import Client, LocalCluster
from rss import PeakRSS


def _bodies(n: int, chunk: int) -> xr.Dataset:
    """Uniform bodies in the unit box, equal masses: Dask arrays made by the workers."""
    rng = da.random.default_rng(42)
    position = rng.random((n, 3), chunks=(chunk, 3))
    velocity = da.zeros((n, 3), chunks=(chunk, 3))
    mass = da.full(n, 1.0 / n, chunks=chunk)
    return xr.Dataset({"position": (("body", "axis"), position),
                       "velocity": (("body", "axis"), velocity),
                       "mass": ("body", mass)}, coords={"axis": ["x", "y", "z"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4_194_304)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import nbody_dask

    out = {"n": args.n, "workers": args.workers, "steps": args.steps,
           "machine": f"{platform.processor() or platform.machine()}, "
                      f"{psutil.cpu_count()} cores"}
    chunk = max(1, args.n // (8 * args.workers))
    kw = dict(steps=args.steps, dt=1e-3, softening=0.0, box_size=1.0, method="treepm",
              dtype="float32", progress=False, snapshot_every=args.steps)
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        nbody_dask.simulate(_bodies(4096, 1024).compute(), client=client,
                            **{**kw, "steps": 1})  # compile the kernels on the workers
        runs = {}
        for name in ("lazy", "memory"):
            with PeakRSS({"driver": psutil.Process()}, interval=0.05) as peak:
                t0 = time.perf_counter()
                bodies = _bodies(args.n, chunk)
                if name == "memory":
                    bodies = bodies.compute()
                traj = nbody_dask.simulate(bodies, store=Path(tmp) / f"{name}.zarr",
                                           client=client, **kw)
                seconds = time.perf_counter() - t0
                del bodies
            runs[name] = traj
            mib = (peak.peak["driver"] - peak.base["driver"]) / 2**20
            out[name] = {"driver_peak_mib": round(mib, 1), "seconds": round(seconds, 1)}
            print(f"{name:>6}: driver peak +{mib:8.1f} MiB, {seconds:6.1f} s", flush=True)
        same = all(np.array_equal(runs["lazy"][v].values, runs["memory"][v].values)
                   for v in ("position", "velocity"))
        out["bit_identical"] = same
        print(f"bit-identical: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
