"""Run from a login node: the driver stays here, Dask workers run as Slurm jobs.

    pip install "nbody-dask[slurm]"
    python deploy/slurm/scale-workers-as-jobs.py --jobs 4 --n 262144 --steps 1000

Site settings (cores, memory, partition, account, interface) come from jobqueue.yaml
(see the file beside this one) or the keywords below.
"""

from __future__ import annotations

import argparse

from distributed import Client

import nbody_dask
from nbody_dask.clusters import slurm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--n", type=int, default=65_536)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--store", default="run.zarr")
    parser.add_argument("--interface", default=None, help="e.g. ib0")
    args = parser.parse_args()

    with slurm(jobs=args.jobs, interface=args.interface) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.jobs, timeout="10m")
        print("dashboard:", client.dashboard_link)
        nbody_dask.simulate(nbody_dask.plummer(args.n, seed=0), steps=args.steps, dt=1 / 256,
                            softening=0.01, store=args.store, snapshot_every=10,
                            dtype="float32", layout="rows", client=client)


if __name__ == "__main__":
    main()
