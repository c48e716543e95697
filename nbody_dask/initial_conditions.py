"""Initial conditions, all seeded and reproducible, in Hénon N-body units unless stated.

Hénon units: G = 1, total mass M = 1, total energy E = -1/4 (virial radius 1). Every generator
returns a body set (see :mod:`nbody_dask.bodies`) centred on its centre of mass, at rest.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from ._validate import check_int, check_real
from .bodies import make_bodies

__all__ = ["uniform_cube", "plummer", "kepler"]

HENON_UNITS = "N-body (Henon) units: G = M = 1, E = -1/4"


def _centred(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = mass / mass.sum()
    return pos - w @ pos, vel - w @ vel


def uniform_cube(n: int, seed: int = 0, *, side: float = 1.0) -> xr.Dataset:
    """Bodies uniformly distributed in a cube, at rest: the classic benchmark set-up.

    Parameters
    ----------
    n : int
        Number of bodies (>= 1); each has mass ``1 / n``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    side : float
        Edge length of the cube, centred on the origin.
    """
    n = check_int("n", n, 1)
    side = check_real("side", side, positive=True)
    rng = np.random.default_rng(seed)
    pos = (rng.random((n, 3)) - 0.5) * side
    mass = np.full(n, 1.0 / n)
    pos, vel = _centred(pos, np.zeros_like(pos), mass)
    ds = make_bodies(pos, vel, mass)
    ds.attrs.update(initial_conditions="uniform_cube", seed=seed, units="G = 1, M = 1")
    return ds


def plummer(n: int, seed: int = 0, *, max_mass_fraction: float = 0.999) -> xr.Dataset:
    """A Plummer sphere in Hénon units, velocities drawn from its distribution function.

    The scale radius is ``a = 3 pi / 16`` so that E = -1/4 in the limit of large ``n``; the
    half-mass radius is then ``a / sqrt(2**(2/3) - 1) ~ 0.769``. Radii follow
    ``M(r) = r^3 / (r^2 + a^2)^(3/2)``; speeds follow ``g(q) = q^2 (1 - q^2)^(7/2)`` in units
    of the local escape speed (von Neumann rejection, Aarseth, Hénon & Wielen 1974).

    Parameters
    ----------
    n : int
        Number of bodies (>= 1), equal masses ``1 / n``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    max_mass_fraction : float
        Radii are drawn from the inner ``max_mass_fraction`` of the mass, which avoids rare
        bodies at very large radii (0.999: outside ~ 10 a).
    """
    n = check_int("n", n, 1)
    max_mass_fraction = check_real("max_mass_fraction", max_mass_fraction, positive=True)
    if max_mass_fraction > 1:
        raise ValueError(f"max_mass_fraction must be <= 1, got {max_mass_fraction!r}")
    rng = np.random.default_rng(seed)
    # Structural units a = 1 first, scaled to Hénon units at the end.
    x = rng.uniform(0.0, max_mass_fraction, n)
    x[x == 0] = np.finfo(float).tiny
    r = 1.0 / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    pos = r[:, None] * _isotropic(rng, n)
    q = _plummer_speed_fractions(rng, n)
    v_escape = math.sqrt(2.0) * (1.0 + r * r) ** -0.25
    vel = (q * v_escape)[:, None] * _isotropic(rng, n)
    a = 3.0 * math.pi / 16.0
    pos *= a
    vel /= math.sqrt(a)
    mass = np.full(n, 1.0 / n)
    pos, vel = _centred(pos, vel, mass)
    ds = make_bodies(pos, vel, mass)
    ds.attrs.update(initial_conditions="plummer", seed=seed, units=HENON_UNITS,
                    scale_radius=a)
    return ds


def _isotropic(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` unit vectors uniformly distributed on the sphere."""
    cos_t = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2.0 * math.pi, n)
    sin_t = np.sqrt(1.0 - cos_t * cos_t)
    return np.stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t], axis=1)


def _plummer_speed_fractions(rng: np.random.Generator, n: int) -> np.ndarray:
    """Samples of ``q = v / v_escape`` with density ``q^2 (1 - q^2)^(7/2)`` on [0, 1]."""
    out = np.empty(n)
    filled = 0
    g_max = 0.1  # max of q^2 (1-q^2)^3.5 is ~0.092 at q = sqrt(2/9)
    while filled < n:
        q = rng.uniform(0.0, 1.0, 2 * (n - filled) + 16)
        y = rng.uniform(0.0, g_max, q.size)
        keep = q[y < q * q * (1.0 - q * q) ** 3.5][: n - filled]
        out[filled:filled + keep.size] = keep
        filled += keep.size
    return out


def kepler(
    eccentricity: float = 0.0,
    *,
    masses: tuple[float, float] = (0.5, 0.5),
    semi_major_axis: float = 1.0,
    G: float = 1.0,
) -> xr.Dataset:
    """A bound two-body (Kepler) orbit, started at pericentre, in the centre-of-mass frame.

    Parameters
    ----------
    eccentricity : float
        Orbital eccentricity, ``0 <= e < 1``.
    masses : (float, float)
        Masses of the two bodies (> 0).
    semi_major_axis : float
        Semi-major axis of the relative orbit.
    G : float
        Gravitational constant.

    Returns
    -------
    xarray.Dataset
        The two bodies; ``attrs["period"]`` is the orbital period
        ``2 pi sqrt(a^3 / (G M))`` and ``attrs["energy"]`` the exact energy ``-G m1 m2 / 2a``.
    """
    e = check_real("eccentricity", eccentricity, nonnegative=True)
    if e >= 1:
        raise ValueError(f"eccentricity must be < 1 for a bound orbit, got {e!r}")
    m1 = check_real("masses[0]", masses[0], positive=True)
    m2 = check_real("masses[1]", masses[1], positive=True)
    a = check_real("semi_major_axis", semi_major_axis, positive=True)
    G = check_real("G", G, positive=True)
    total = m1 + m2
    r_peri = a * (1.0 - e)
    v_peri = math.sqrt(G * total * (1.0 + e) / (a * (1.0 - e)))
    rel_pos = np.array([r_peri, 0.0, 0.0])
    rel_vel = np.array([0.0, v_peri, 0.0])
    pos = np.stack([-m2 / total * rel_pos, m1 / total * rel_pos])
    vel = np.stack([-m2 / total * rel_vel, m1 / total * rel_vel])
    ds = make_bodies(pos, vel, np.array([m1, m2]))
    ds.attrs.update(
        initial_conditions="kepler",
        eccentricity=e,
        semi_major_axis=a,
        period=2.0 * math.pi * math.sqrt(a**3 / (G * total)),
        energy=-G * m1 * m2 / (2.0 * a),
        units=f"G = {G}",
    )
    return ds
