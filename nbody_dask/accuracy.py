"""How accurate a set of forces is: relative errors against a float64 direct sum.

The reference is computed for a random sample of targets only (each is one pass over all
sources in float64, on all cores), so it costs ``sample x N`` interactions: checking a
million-body force evaluation on 1,000 targets takes about as long as one direct step of
32,000 bodies.

>>> bodies = nbody_dask.plummer(65536, seed=0)                       # doctest: +SKIP
>>> acc = nbody_dask.accelerations(bodies, softening=0.01, dtype="float32")  # doctest: +SKIP
>>> print(force_errors(bodies, acc, softening=0.01))                 # doctest: +SKIP
relative force error over 1000 targets: median 6.1e-08, p99 2.6e-07, max 4.9e-07
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validate import check_int, check_real
from .bodies import Tile, as_bodies

__all__ = ["ForceErrors", "force_errors", "direct_reference", "sample_targets",
           "relative_errors", "error_statistics", "pick_targets", "join_targets",
           "reference_partial", "sampled_errors"]

#: Sources per block of the reference sum (a block is one parallel work item per target block).
_SOURCE_BLOCK = 65_536


@dataclass(frozen=True)
class ForceErrors:
    """Relative force errors ``|a - a_ref| / |a_ref|`` on sampled targets.

    Attributes
    ----------
    median, p99, max : float
        Statistics of ``errors``.
    targets : ndarray of int64
        The sampled bodies (indices into the body set), ascending.
    errors : ndarray of float64
        One per target. A target whose reference force is exactly zero (a lone body) has
        error 0 if its force is zero too, else infinity.
    """

    median: float
    p99: float
    max: float
    targets: np.ndarray
    errors: np.ndarray

    def __str__(self) -> str:
        return (f"relative force error over {len(self.targets)} targets: median "
                f"{self.median:.2g}, p99 {self.p99:.2g}, max {self.max:.2g}")

    def as_dict(self) -> dict[str, Any]:
        """The statistics and the sample size, for JSON."""
        return {"median": self.median, "p99": self.p99, "max": self.max,
                "targets": len(self.targets)}


def direct_reference(bodies: Any, targets: np.ndarray, softening: float = 0.0,
                     G: float = 1.0, box_size: float | None = None) -> np.ndarray:
    """Accelerations of bodies ``targets`` by a float64 direct sum over all bodies (in a
    periodic cube of side ``box_size``: the Ewald sum, :mod:`nbody_dask.kernels.ewald`).

    Returns
    -------
    ndarray, shape (len(targets), 3), float64
    """
    from .kernels.rows import row_forces

    ds = as_bodies(bodies)
    position = ds["position"].values.astype(np.float64)
    mass = ds["mass"].values.astype(np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if box_size is not None:
        from .kernels.ewald import ewald_forces

        x = position.T
        return G * ewald_forces(x[:, targets], x, mass, box_size, softening)[:3].T
    n = position.shape[0]
    starts = np.append(np.arange(0, n, _SOURCE_BLOCK), n)  # blocks [starts[j], starts[j+1])
    xt, yt, zt = (np.ascontiguousarray(position[targets, a]) for a in range(3))
    xs, ys, zs = (np.ascontiguousarray(position[:, a]) for a in range(3))
    eps2 = np.float64(softening) ** 2
    parts = row_forces(xt, yt, zt, xs, ys, zs, mass, starts.astype(np.int64), eps2, False, -1)
    return G * parts.sum(axis=0).T  # blocks summed in order: deterministic


def force_errors(bodies: Any, accelerations: np.ndarray, *, softening: float = 0.0,
                 G: float = 1.0, sample: int = 1000, seed: int = 0,
                 box_size: float | None = None) -> ForceErrors:
    """Relative errors of ``accelerations`` against a float64 direct sum (the Ewald sum in
    a periodic cube of side ``box_size``).

    Parameters
    ----------
    bodies : xarray.Dataset or Mapping
        The body set the accelerations are of.
    accelerations : array_like, shape (n, 3)
        As :func:`nbody_dask.accelerations` returns them (any method, any dtype).
    softening, G : float
        Those the accelerations were computed with.
    sample : int, default 1000
        Number of targets, drawn without replacement (all bodies if there are fewer).
    seed : int, default 0
        Seed of the draw.
    box_size : float, optional
        The side of the periodic cube the accelerations were computed in.

    Returns
    -------
    ForceErrors

    Raises
    ------
    ValueError
        If ``accelerations`` does not have shape (n, 3), or a parameter is out of range.
    """
    ds = as_bodies(bodies)
    n = ds.sizes["body"]
    softening = check_real("softening", softening, nonnegative=True)
    G = check_real("G", G)
    sample = check_int("sample", sample, 1)
    seed = check_int("seed", seed, 0)
    acc = np.asarray(accelerations)
    if acc.shape != (n, 3):
        raise ValueError(f"accelerations must have shape ({n}, 3) for {n} bodies, got "
                         f"{acc.shape}")
    targets = sample_targets(n, sample, seed)
    if box_size is not None:
        box_size = check_real("box_size", box_size, positive=True)
    ref = direct_reference(ds, targets, softening, G, box_size)
    errors = relative_errors(acc[targets], ref)
    return ForceErrors(*error_statistics(errors), targets, errors)


def sample_targets(n: int, sample: int, seed: int = 0) -> np.ndarray:
    """``min(sample, n)`` distinct body indices of ``n``, drawn with ``seed``, ascending."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(sample, n), replace=False)).astype(np.int64)


def relative_errors(accelerations: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``|a - a_ref| / |a_ref|`` per row of two (k, 3) arrays, in float64; a row whose
    reference is exactly zero has error 0 if its acceleration is zero too, else infinity."""
    diff = np.linalg.norm(np.asarray(accelerations, np.float64) - reference, axis=1)
    norm = np.linalg.norm(reference, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norm > 0, diff / np.where(norm > 0, norm, 1.0),
                        np.where(diff > 0, np.inf, 0.0))


def error_statistics(errors: np.ndarray) -> tuple[float, float, float]:
    """Median, 99th percentile and maximum of relative errors (zeros when there are none)."""
    if errors.size == 0:
        return 0.0, 0.0, 0.0
    with np.errstate(invalid="ignore"):  # inf - inf between infinite errors
        median, p99 = np.median(errors), np.quantile(errors, 0.99)
    median, p99 = (np.inf if np.isnan(v) else float(v) for v in (median, p99))
    return median, p99, float(errors.max())


# -- the sampled force errors recorded at snapshots (task functions, see graph.snapshot_graph) --

def pick_targets(tile: Tile, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions and accelerations, (3, k) float64 each, of the bodies of a tile in body
    order (``start, start + 1, ...``) that are among ``targets`` (sorted body indices)."""
    lo, hi = np.searchsorted(targets, [tile.start, tile.start + tile.size])
    local = targets[lo:hi] - tile.start
    return (tile.position[:, local].astype(np.float64),
            tile.acceleration[:, local].astype(np.float64))


def join_targets(*picks: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The picks of all tiles, in tile order: positions and accelerations, (3, K) each."""
    return (np.ascontiguousarray(np.concatenate([p for p, _ in picks], axis=1)),
            np.ascontiguousarray(np.concatenate([a for _, a in picks], axis=1)))


def reference_partial(targets: tuple[np.ndarray, np.ndarray], source: Tile,
                      softening: float, box_size: float | None = None) -> np.ndarray:
    """Accelerations (3, K), float64, G = 1, of the target positions due to one tile (and
    its images in a periodic cube of side ``box_size``: the Ewald sum is a sum over
    sources, so tiles add up to it)."""
    from .kernels.cpu import accel_tile

    position = targets[0]
    if box_size is not None:
        from .kernels.ewald import ewald_forces

        return ewald_forces(position, source.position, source.mass, box_size, softening)[:3]
    xs, ys, zs = (np.ascontiguousarray(row, dtype=np.float64) for row in source.position)
    return accel_tile(position[0], position[1], position[2], xs, ys, zs,
                      source.mass.astype(np.float64), np.float64(softening) ** 2)


def sampled_errors(targets: tuple[np.ndarray, np.ndarray], G: float,
                   reference: np.ndarray) -> np.ndarray:
    """``[median, p99, max]`` of the targets' relative force errors: their accelerations
    against ``G`` times ``reference``, the float64 direct sum (3, K) with G = 1."""
    errors = relative_errors(targets[1].T, G * reference.T)
    return np.array(error_statistics(errors))
