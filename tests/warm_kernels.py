"""Compile the Numba kernels the suite uses into Numba's on-disk cache, one share of them.

``python tests/warm_kernels.py SHARE SHARES`` runs every ``SHARES``-th of a few tiny
simulations (each method and dtype), starting at ``SHARE``. ``conftest.py`` runs the shares
side by side before the test workers start: every kernel is then compiled once, instead of
by each worker (and by the subprocesses of the command-line tests) that reaches it before
the cache holds it. Not a test: what it runs, the tests check.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np


def _jobs() -> list[tuple[str, dict]]:
    """(name, simulate's arguments) of each run, the longest compiles first."""
    import nbody_dask

    sphere = nbody_dask.plummer(300, seed=1)
    x = np.random.default_rng(0).random((300, 3))
    box = nbody_dask.make_bodies(x, np.zeros_like(x), np.full(300, 1 / 300))
    jobs = [(f"treepm-{d}", dict(bodies=box, method="treepm", dtype=d, box_size=1.0))
            for d in ("float32", "float64")]
    jobs += [(f"tree-{d}", dict(bodies=sphere, method="tree", dtype=d))
             for d in ("float32", "float64")]
    jobs += [("ewald", dict(bodies=box, method="direct", dtype="float64", box_size=1.0))]
    jobs += [(f"individual-{m}", dict(bodies=sphere, method=m, timestep="individual",
                                      time_bins=3, tile_size=300)) for m in ("tree", "direct")]
    jobs += [(f"direct-{d}", dict(bodies=sphere, method="direct", dtype=d))
             for d in ("float32", "float64")]
    jobs += [(f"rows-{d}", dict(bodies=sphere, method="direct", dtype=d, layout="rows"))
             for d in ("float32", "float64")]
    jobs += [(f"near-far-{d}", dict(bodies=sphere, method="tree", dtype=d, tile_size=10,
                                    config={"nbody.near-far-tiles": 16}))
             for d in ("float32", "float64")]
    jobs += [("ewald-float32", dict(bodies=box, method="direct", dtype="float32",
                                    box_size=1.0))]
    jobs += [("treepm-slabs", dict(bodies=box, method="treepm", box_size=1.0, mesh_slabs=2))]
    return jobs


def main(share: int, shares: int) -> None:
    import dask
    import nbody_dask
    from distributed import Client, LocalCluster

    warnings.simplefilter("ignore")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for _, kwargs in _jobs()[share::shares]:
            bodies = kwargs.pop("bodies")
            kwargs.setdefault("tile_size", 150)
            with dask.config.set(kwargs.pop("config", {})):
                nbody_dask.simulate(bodies, steps=2, dt=1e-3, softening=0.01, client=client,
                                    progress=False, **kwargs)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
