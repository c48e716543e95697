"""The tree's cost with a far outlier (issue 33, item 15): one evaluation of a 20,000-body
Plummer sphere by the tree kernel (one tile, all threads), with and without one more body at
x = 1e9, best of 3 after a warm-up, and the median force error with the outlier against a
float64 direct sum on every 97th body.

    python benchmarks/outlier.py
"""

import time

import numpy as np

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


if __name__ == "__main__":
    main()
