"""Run a simulation on this machine's GPUs: dask-cuda's LocalCUDACluster, one worker per GPU.

    pip install "nbody-dask[gpu]"
    python deploy/gpu/local_cuda_cluster.py --n 262144 --steps 100 --store gpu-run.zarr

Each worker pins one GPU (CUDA_VISIBLE_DEVICES); with backend="cuda" every tile-pair task
runs the Numba CUDA kernel, with larger tiles than on CPUs. The same from the shell:
``nbody-dask run --cluster cuda --backend cuda --dtype float32 ...``.
"""

from __future__ import annotations

import argparse
import sys
import time

from distributed import Client

import nbody_dask
from nbody_dask import clusters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=262_144)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--store", default="gpu-run.zarr")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)

    try:
        cluster = clusters.cuda()
    except Exception as exc:  # no dask-cuda, no driver, no GPU: one line, not a traceback
        print(f"error: cannot start a LocalCUDACluster: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    with cluster, Client(cluster) as client:
        print(f"{len(client.nthreads())} GPU worker(s); dashboard {client.dashboard_link}")
        t0 = time.perf_counter()
        trajectory = nbody_dask.simulate(
            nbody_dask.plummer(args.n, seed=0), steps=args.steps, dt=1e-3, softening=0.01,
            dtype=args.dtype, backend="cuda", store=args.store, snapshot_every=10,
            overwrite=args.overwrite, client=client)
        seconds = time.perf_counter() - t0
    rate = args.n ** 2 * args.steps / seconds
    print(f"{args.steps} steps in {seconds:.1f} s (start-up included): {rate / 1e9:.1f} Gint/s, "
          f"{20 * rate / 1e12:.2f} TFLOPS (20 FLOP/interaction); tile size "
          f"{trajectory.attrs['tile_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
