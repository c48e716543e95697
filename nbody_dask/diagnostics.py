"""Conserved quantities: energies, linear and angular momentum, virial ratio.

Per-tile partial sums are computed in float64 whatever the run's dtype, then reduced over
tiles in a fixed order by the task graph, so diagnostics are reproducible too.
"""

from __future__ import annotations

import numpy as np

from .bodies import Tile

__all__ = ["tile_diagnostics", "as_record", "virial_ratio", "ERROR_STATISTICS"]

#: The statistics of a snapshot's sampled force errors, in order (the store's ``statistic``
#: coordinate; :func:`nbody_dask.accuracy.sampled_errors` computes them).
ERROR_STATISTICS = ("median", "p99", "max")


def tile_diagnostics(tile: Tile, G: float) -> np.ndarray:
    """Kinetic energy, potential energy, momentum and angular momentum of one tile.

    The potential energy is ``0.5 * sum_i m_i phi_i``: every pair appears twice over all
    tiles. Needs ``tile.potential`` (present on snapshot steps).

    Returns
    -------
    ndarray, shape (8,), float64
        ``[K, W, px, py, pz, Lx, Ly, Lz]``.
    """
    m = tile.mass.astype(np.float64)
    x = tile.position.astype(np.float64)
    v = tile.velocity.astype(np.float64)
    out = np.empty(8)
    out[0] = 0.5 * np.sum(m * np.einsum("ij,ij->j", v, v))
    out[1] = 0.5 * np.sum(m * tile.potential.astype(np.float64))
    out[2:5] = v @ m
    out[5:8] = np.cross(x.T, v.T).T @ m
    return out


def as_record(vector: np.ndarray) -> dict[str, float | np.ndarray]:
    """Name the entries of a diagnostics vector; adds ``total_energy``.

    Entries 8-10, where present, are the snapshot's sampled force errors (median, p99,
    max), named ``force_error``.
    """
    rec: dict[str, float | np.ndarray] = {
        "kinetic_energy": float(vector[0]),
        "potential_energy": float(vector[1]),
        "momentum": np.asarray(vector[2:5]),
        "angular_momentum": np.asarray(vector[5:8]),
    }
    rec["total_energy"] = rec["kinetic_energy"] + rec["potential_energy"]
    if vector.shape[0] > 8:  # the run records sampled force errors
        rec["force_error"] = np.asarray(vector[8:11])
    return rec


def virial_ratio(kinetic_energy: float, potential_energy: float) -> float:
    """``2K / |W|``: 1 for a system in virial equilibrium."""
    return 2.0 * kinetic_energy / abs(potential_energy)
