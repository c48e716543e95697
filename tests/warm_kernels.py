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


def _jobs() -> list[dict]:
    """simulate's arguments of each run, about the longest compiles first (measured one
    after another in an empty cache: TreePM 85 s a dtype, the tree 20-30 s, Ewald and the
    near-far tree 10-20 s, the rest under 15 s), so that every ``SHARES``-th share holds
    about as much."""
    import nbody_dask

    sphere = nbody_dask.plummer(300, seed=1)
    x = np.random.default_rng(0).random((300, 3))
    box = nbody_dask.make_bodies(x, np.zeros_like(x), np.full(300, 1 / 300))
    dtypes = ("float32", "float64")
    return [
        *(dict(bodies=box, method="treepm", dtype=d, box_size=1.0) for d in dtypes),
        *(dict(bodies=sphere, method="tree", dtype=d) for d in dtypes),
        *(dict(bodies=box, method="direct", dtype=d, box_size=1.0) for d in dtypes),
        *(dict(bodies=sphere, method="tree", dtype=d, tile_size=10,
               config={"nbody.near-far-tiles": 16}) for d in dtypes),
        *(dict(bodies=sphere, method=m, timestep="individual", time_bins=3, tile_size=300)
          for m in ("tree", "direct")),
        *(dict(bodies=sphere, method="direct", dtype=d) for d in dtypes),
        *(dict(bodies=sphere, method="direct", dtype=d, layout="rows") for d in dtypes),
        dict(bodies=box, method="treepm", box_size=1.0, mesh_slabs=2),
    ]


def main(share: int, shares: int) -> None:
    import dask
    import nbody_dask
    from distributed import Client, LocalCluster

    warnings.simplefilter("ignore")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for kwargs in _jobs()[share::shares]:
            bodies = kwargs.pop("bodies")
            kwargs.setdefault("tile_size", 150)
            with dask.config.set(kwargs.pop("config", {})):
                nbody_dask.simulate(bodies, steps=2, dt=1e-3, softening=0.01, client=client,
                                    progress=False, **kwargs)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
