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
ds = nbody_dask.plummer(20000, seed=1)
pos = ds.position.values.T.copy(); m = ds.mass.values.copy()
far = np.concatenate([pos, [[1e9], [0.0], [0.0]]], axis=1); mf = np.concatenate([m, [m[0]]])
def best(p, mm):
    tree.tree_accelerations(p, mm, 0.01, 0.4, 64)
    t = []
    for _ in range(3):
        s = time.perf_counter(); tree.tree_accelerations(p, mm, 0.01, 0.4, 64); t.append(time.perf_counter() - s)
    return min(t)
a, b = best(pos, m), best(far, mf)
acc = tree.tree_accelerations(far, mf, 0.01, 0.4, 64)
from nbody_dask.testing import direct_sum_reference
idx = np.arange(0, 20001, 97)
ref, _ = direct_sum_reference(far.T, mf, 0.01, targets=idx)
err = np.linalg.norm(acc.T[idx] - ref, axis=1) / np.linalg.norm(ref, axis=1)
print(f"without outlier {a:.3f} s, with outlier {b:.3f} s, ratio {b/a:.2f}; median error with outlier {np.median(err):.2e}")
