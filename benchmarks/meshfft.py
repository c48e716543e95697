"""The mesh's distributed FFT (nbody_dask.meshfft) against one scipy.fft call on the same cores.

For each mesh size and decomposition: the largest difference from ``scipy.fft.rfftn`` relative
to the largest coefficient, and the time of the forward transform on a local cluster of one
worker with every core (best of 3, a fresh input each time so no result is reused) against
``scipy.fft.rfftn(..., workers=cores)``, in one run.

    python benchmarks/meshfft.py --sizes 64 128 256 512 --json benchmarks/results/<name>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import dask
import dask.array as da
import numpy as np
import scipy.fft
from distributed import Client, LocalCluster, wait

from nbody_dask import meshfft

LAYOUTS = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 4))  # chunks along axes 0 and 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    dask.config.set({"array.rechunk.method": "tasks"})
    warnings.filterwarnings("ignore", message=".*Sending large graph.*")
    warnings.filterwarnings("ignore", message=".*large graph.*")
    with LocalCluster(n_workers=1, threads_per_worker=cores, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster):
        for n in args.sizes:
            mesh = np.random.default_rng(n).random((n, n, n)).astype(args.dtype)
            want = scipy.fft.rfftn(mesh)
            scale = np.abs(want).max()
            reference = _best(lambda mesh=mesh: scipy.fft.rfftn(mesh, workers=cores))
            for first, second in LAYOUTS:
                chunked = meshfft.pencils(mesh, first, second)
                error = float(np.abs(meshfft.rfftn(chunked).compute() - want).max() / scale)
                seconds = _cluster_time(n, first, second, args.dtype)
                rows.append(dict(n=n, chunks=[first, second], relative_error=error,
                                 seconds=seconds, scipy_seconds=reference,
                                 ratio=seconds / reference))
                print(f"{n}^3 {first}x{second}: error {error:.1e}, {seconds:.3f} s, scipy "
                      f"{reference:.3f} s, ratio {seconds / reference:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="meshfft", dtype=args.dtype, cores=cores,
                           machine=platform.processor() or platform.machine(),
                           date=time.strftime("%Y-%m-%d"), rows=rows), f, indent=1)


def _best(run, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _cluster_time(n: int, first: int, second: int, dtype: str) -> float:
    """The forward transform on the cluster, its input already in memory there."""
    chunks = (-(-n // first), -(-n // second), n)
    base = da.random.default_rng(0).random((n, n, n), dtype=np.dtype(dtype).type,
                                           chunks=chunks)
    times = []
    for k in range(3):
        mesh = (base * np.dtype(dtype).type(1 + k)).persist()  # new keys: nothing reused
        wait(mesh)
        start = time.perf_counter()
        spectrum = meshfft.rfftn(mesh).persist()
        wait(spectrum)
        times.append(time.perf_counter() - start)
        del spectrum, mesh
    return min(times)


if __name__ == "__main__":
    main()
