"""Test oracles: independent, plain NumPy float64 references that no production path uses.

The tests (and the GPU check, which runs without the test suite) compare the kernels with
these; they are written for clarity, not speed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["direct_sum_reference"]


def direct_sum_reference(position, mass, softening=0.0, G=1.0, targets=None, block=256):
    """Independent float64 NumPy direct sum: accelerations and potentials.

    Memory is O(``block`` x N): any N works, slowly.

    Parameters
    ----------
    position : array_like, shape (n, 3)
    mass : array_like, shape (n,)
    softening : float
        Plummer softening length eps.
    G : float
        Gravitational constant.
    targets : array_like of int, optional
        The bodies to compute for (all by default).
    block : int
        Targets per NumPy pass.

    Returns
    -------
    acc : ndarray, shape (k, 3)
    phi : ndarray, shape (k,)
        Potential of each target, self term excluded. Bodies at a target's position exert
        nothing on it (with or without softening).
    """
    pos = np.asarray(position, dtype=np.float64)
    m = np.asarray(mass, dtype=np.float64)
    targets = np.arange(len(pos)) if targets is None else np.asarray(targets, dtype=np.int64)
    acc = np.empty((len(targets), 3))
    phi = np.empty(len(targets))
    for lo in range(0, len(targets), block):
        t = targets[lo:lo + block]
        d = pos[None, :, :] - pos[t][:, None, :]  # d[i, j] = r_j - r_i
        r2 = np.einsum("ijk,ijk->ij", d, d) + float(softening) ** 2
        r2[np.arange(len(t)), t] = np.inf  # self term: zero force, excluded from phi
        with np.errstate(divide="ignore"):
            inv = np.where(r2 > 0, 1.0 / np.sqrt(r2), 0.0)
        acc[lo:lo + block] = G * np.einsum("ij,ijk->ik", m[None, :] * inv**3, d)
        phi[lo:lo + block] = -G * (inv * m[None, :]).sum(axis=1)
    return acc, phi
