"""The tree's cost with a far outlier (issue 33, item 15): one evaluation of a 20,000-body
Plummer sphere by the tree kernel (one tile, all threads), with and without one more body at
x = 1e9, best of 3 after a warm-up, and the median force error with the outlier against a
float64 direct sum on every 97th body; then the same through ``accelerations(method="tree")``
on 4 spatial tiles (the keys' cube shared by the tiles) on the default local cluster.

    python benchmarks/outlier.py
"""

import time

import numpy as np
from distributed import Client, LocalCluster

import nbody_dask
from nbody_dask.kernels import tree
from nbody_dask.testing import direct_sum_reference


def best_of_3(position, mass):
    tree.tree_accelerations(position, mass, 0.01, 0.4, 64)  # compile, warm up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        tree.tree_accelerations(position, mass, 0.01, 0.4, 64)
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    bodies = nbody_dask.plummer(20000, seed=1)
    position, mass = bodies.position.values.T.copy(), bodies.mass.values.copy()
    far = np.concatenate([position, [[1e9], [0.0], [0.0]]], axis=1)
    far_mass = np.append(mass, mass[0])
    alone, with_outlier = best_of_3(position, mass), best_of_3(far, far_mass)
    acc = tree.tree_accelerations(far, far_mass, 0.01, 0.4, 64)
    targets = np.arange(0, 20001, 97)
    ref, _ = direct_sum_reference(far.T, far_mass, 0.01, targets=targets)
    err = np.linalg.norm(acc.T[targets] - ref, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"without the outlier {alone:.3f} s, with it {with_outlier:.3f} s, ratio "
          f"{with_outlier / alone:.2f}; median force error with it {np.median(err):.2e}")
    far_bodies = nbody_dask.make_bodies(far.T, np.zeros_like(far.T), far_mass)
    near_bodies = nbody_dask.make_bodies(position.T, np.zeros_like(position.T), mass)
    with Client(LocalCluster(host="127.0.0.1", dashboard_address="127.0.0.1:0")) as client:
        times = {}
        for name, ds in (("without", near_bodies), ("with", far_bodies)):
            def evaluate(ds=ds):
                return nbody_dask.accelerations(ds, 0.01, method="tree", theta=0.4,
                                                tile_size=5001, client=client)
            evaluate()
            times[name] = min(_timed(evaluate) for _ in range(3))
    print(f"4 tiles: without the outlier {times['without']:.3f} s, with it "
          f"{times['with']:.3f} s, ratio {times['with'] / times['without']:.2f}")


def _timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
