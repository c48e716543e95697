"""Initial conditions, all seeded and reproducible, in Hénon N-body units unless stated.

Hénon units: G = 1, total mass M = 1, total energy E = -1/4 (virial radius 1). Every generator
returns a body set (see :mod:`nbody_dask.bodies`) centred on its centre of mass, at rest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import xarray as xr

from ._validate import check_int, check_memory, check_real
from .bodies import make_bodies, wrap

__all__ = [
    "uniform_cube",
    "plummer",
    "hernquist",
    "kepler",
    "cold_collapse",
    "merger",
    "exponential_disk",
    "freeman_circular_speed",
    "plummer_clumps",
    "GENERATORS",
    "generate",
]

HENON_UNITS = "N-body (Henon) units: G = M = 1, E = -1/4"


#: Bytes per body of a generator at its peak: float64 positions, velocities and masses (56)
#: and the few temporary arrays of the same size that sampling makes.
GENERATOR_BYTES_PER_BODY = 256


def _body_count(n: Any, minimum: int) -> int:
    """``n`` checked as a number of bodies: an integer >= ``minimum`` whose body set fits in
    this machine's memory (a one-line MemoryError before any allocation otherwise)."""
    n = check_int("n", n, minimum)
    check_memory("n", n, n * GENERATOR_BYTES_PER_BODY, "the initial conditions")
    return n


def _centred(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = mass / mass.sum()
    return pos - w @ pos, vel - w @ vel


def _finish(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray, **attrs) -> xr.Dataset:
    """Centre on the centre of mass, at rest, and build the body set with its attributes."""
    pos, vel = _centred(pos, vel, mass)
    ds = make_bodies(pos, vel, mass)
    ds.attrs.update(attrs)
    return ds


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
    n = _body_count(n, 1)
    side = check_real("side", side, positive=True)
    rng = np.random.default_rng(seed)
    pos = (rng.random((n, 3)) - 0.5) * side
    mass = np.full(n, 1.0 / n)
    return _finish(pos, np.zeros_like(pos), mass, initial_conditions="uniform_cube", seed=seed,
                   units="G = 1, M = 1")


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
    n = _body_count(n, 1)
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
    return _finish(pos, vel, mass, initial_conditions="plummer", seed=seed, units=HENON_UNITS,
                   scale_radius=a)


def hernquist(n: int, seed: int = 0, *, max_mass_fraction: float = 0.99) -> xr.Dataset:
    """A Hernquist (1990) sphere in Hénon units: a cusp, ``rho ~ 1 / r`` at the centre, with
    velocities from its isotropic distribution function.

    The scale radius is ``a = 1 / 3`` so that E = -GM^2 / (12 a) = -1/4 in the limit of large
    ``n``; the half-mass radius is ``(1 + sqrt 2) a ~ 0.805``. Radii follow ``M(r) = r^2 /
    (r + a)^2``; at each radius the speed is drawn from ``v^2 f(psi - v^2 / 2)`` (Hernquist's
    eq. 17) by inverting its cumulative sum on a fine grid. The dynamical times span orders of
    magnitude from the centre out: the set-up that individual time steps are for.

    Parameters
    ----------
    n : int
        Number of bodies (>= 1), equal masses ``1 / n``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    max_mass_fraction : float
        Radii are drawn from the inner ``max_mass_fraction`` of the mass (0.99: inside
        ~ 200 a).
    """
    n = _body_count(n, 1)
    max_mass_fraction = check_real("max_mass_fraction", max_mass_fraction, positive=True)
    if max_mass_fraction >= 1:
        raise ValueError(f"max_mass_fraction must be < 1, got {max_mass_fraction!r}")
    rng = np.random.default_rng(seed)
    # Structural units a = G = M = 1 first, scaled to Hénon units at the end.
    root = np.sqrt(rng.uniform(0.0, max_mass_fraction, n))
    r = root / (1.0 - root)
    pos = r[:, None] * _isotropic(rng, n)
    psi = 1.0 / (1.0 + r)
    fractions = np.empty(n)
    grid = (np.arange(512) + 0.5) / 512  # speed in units of the local escape speed
    for lo in range(0, n, 8192):  # bounded memory: 8192 x 512 densities at a time
        hi = min(lo + 8192, n)
        density = grid**2 * _hernquist_df(psi[lo:hi, None] * (1.0 - grid**2))
        cumulative = np.cumsum(density, axis=1)
        cumulative /= cumulative[:, -1:]
        u = rng.random(hi - lo)
        fractions[lo:hi] = [np.interp(ui, c, grid) for ui, c in zip(u, cumulative,
                                                                      strict=True)]
    vel = (fractions * np.sqrt(2.0 * psi))[:, None] * _isotropic(rng, n)
    a = 1.0 / 3.0
    pos *= a
    vel /= math.sqrt(a)
    mass = np.full(n, 1.0 / n)
    return _finish(pos, vel, mass, initial_conditions="hernquist", seed=seed,
                   units=HENON_UNITS, scale_radius=a)


def _hernquist_df(binding: np.ndarray) -> np.ndarray:
    """Hernquist's isotropic distribution function (G = M = a = 1) of the binding energy
    ``-E`` in (0, 1), up to its constant factor."""
    q = np.sqrt(np.clip(binding, 0.0, 1.0 - 1e-12))
    q2 = q * q
    return (3.0 * np.arcsin(q) + q * np.sqrt(1.0 - q2) * (1.0 - 2.0 * q2)
            * (8.0 * q2 * q2 - 8.0 * q2 - 3.0)) / (1.0 - q2) ** 2.5


def plummer_clumps(n: int, seed: int = 0, *, clumps: int = 20, box_size: float = 1.0,
                   smallest: float = 0.005, largest: float = 0.05) -> xr.Dataset:
    """A clustered periodic box: ``clumps`` Plummer spheres of random scale radii (log-uniform
    between ``smallest`` and ``largest`` times ``box_size``) at random places in the cube
    ``[0, box_size)^3``, wrapped into it: the clustered test of a periodic force. Each
    sphere is in equilibrium on its own (velocities from its distribution function, G = 1),
    its centre at rest.

    Parameters
    ----------
    n : int
        Number of bodies (>= 1), mass ``1 / n`` each, shared among the clumps at random.
    seed : int
        Seed of :func:`numpy.random.default_rng` (each clump's bodies from ``seed`` and its
        index).
    clumps : int
        Number of Plummer spheres (>= 1).
    box_size : float
        Side of the cube.
    smallest, largest : float
        Range of the clumps' scale radii, in units of ``box_size``.
    """
    n = _body_count(n, 1)
    clumps = check_int("clumps", clumps, 1)
    box_size = check_real("box_size", box_size, positive=True)
    smallest = check_real("smallest", smallest, positive=True)
    largest = check_real("largest", largest, positive=True)
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(n, np.full(clumps, 1.0 / clumps))
    parts, speeds = [], []
    for k, count in enumerate(sizes):
        if count == 0:
            continue
        radius = box_size * np.exp(rng.uniform(np.log(smallest), np.log(largest)))
        sphere = plummer(int(count), seed=seed * 1000 + k)
        scale = radius / (3 * np.pi / 16)  # Henon units: scale radius 3 pi / 16, M = 1
        parts.append(sphere.position.values * scale + rng.random(3) * box_size)
        speeds.append(sphere.velocity.values * np.sqrt((count / n) / scale))
    pos = wrap(np.concatenate(parts), box_size)
    ds = make_bodies(pos, np.concatenate(speeds), np.full(n, 1.0 / n))
    ds.attrs.update(initial_conditions="plummer_clumps", seed=seed, box_size=box_size,
                    units="G = 1, M = 1")
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
        Masses of the two bodies (> 0); or mass quantities (``1 * u.solMass``).
    semi_major_axis : float
        Semi-major axis of the relative orbit; or a length quantity (``1 * u.AU``). With
        quantities the code units are ``a`` and the total mass (G = 1,
        :mod:`nbody_dask.units`), so that the period is ``2 pi`` code time units.
    G : float
        Gravitational constant.

    Returns
    -------
    xarray.Dataset
        The two bodies; ``attrs["period"]`` is the orbital period
        ``2 pi sqrt(a^3 / (G M))`` and ``attrs["energy"]`` the exact energy ``-G m1 m2 / 2a``.
    """
    from .units import UnitSystem, is_quantity

    if any(is_quantity(v) for v in (*masses, semi_major_axis)):
        if G != 1.0:
            raise ValueError("with quantities G is the physical one: leave G=1")
        system = UnitSystem(semi_major_axis, masses[0] + masses[1])
        ds = kepler(eccentricity, masses=tuple(float(m / system.mass) for m in masses))
        ds.attrs.update(system.attrs())
        return ds
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


def cold_collapse(n: int, seed: int = 0, *, virial_ratio: float = 0.0) -> xr.Dataset:
    """A homogeneous sphere that starts (nearly) at rest: the classic cold-collapse test.

    In Hénon units: total mass 1 and, for the continuum sphere, energy -1/4. A uniform sphere
    of radius ``R`` has ``W = -3 / (5 R)``; with ``2K / |W| = virial_ratio`` the energy is
    ``W (1 - virial_ratio / 2)``, so ``R = 12/5 (1 - virial_ratio / 2)`` (2.4 when cold).

    Parameters
    ----------
    n : int
        Number of bodies (>= 1), equal masses ``1 / n``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    virial_ratio : float
        ``2K / |W|`` of the start, ``0 <= virial_ratio < 2`` (0: exactly cold). Velocities are
        isotropic Gaussian, scaled to that ratio of the continuum sphere's ``W``.
    """
    n = _body_count(n, 1)
    q = check_real("virial_ratio", virial_ratio, nonnegative=True)
    if q >= 2:
        raise ValueError(f"virial_ratio must be < 2 for a bound sphere, got {q!r}")
    rng = np.random.default_rng(seed)
    radius = 12.0 / 5.0 * (1.0 - q / 2.0)
    pos = (radius * rng.random(n) ** (1.0 / 3.0))[:, None] * _isotropic(rng, n)
    mass = np.full(n, 1.0 / n)
    vel = np.zeros_like(pos)
    if q > 0:
        vel = rng.standard_normal((n, 3))
        vel -= vel.mean(axis=0)
        kinetic = q * (3.0 / (5.0 * radius)) / 2.0
        vel *= math.sqrt(kinetic / (0.5 * np.sum(mass * (vel**2).sum(axis=1))))
    return _finish(pos, vel, mass, initial_conditions="cold_collapse", seed=seed,
                   units=HENON_UNITS, radius=radius, virial_ratio=q)


def merger(
    n: int,
    seed: int = 0,
    *,
    mass_ratio: float = 1.0,
    separation: float = 10.0,
    impact_parameter: float = 0.0,
    relative_speed: float | None = None,
) -> xr.Dataset:
    """Two Plummer spheres on a collision course: a galaxy-merger set-up.

    Each sphere is a :func:`plummer` sphere with the same size as the Hénon-units one (virial
    radius 1 at mass 1) and velocities scaled to its mass; together they weigh 1. Bodies have
    equal masses, so the spheres get bodies in proportion to their masses. The relative orbit
    starts at ``(separation, impact_parameter, 0)`` with velocity ``(-relative_speed, 0, 0)``
    in the centre-of-mass frame.

    Parameters
    ----------
    n : int
        Total number of bodies (>= 2).
    seed : int
        Seed of the first sphere; the second uses ``seed + 1``.
    mass_ratio : float
        Mass of the second sphere over the first (0 < mass_ratio <= 1).
    separation : float
        Initial distance of the centres along x (> 0).
    impact_parameter : float
        Offset of the centres along y (>= 0).
    relative_speed : float, optional
        Approach speed; by default that of a parabolic orbit of two point masses,
        ``sqrt(2 G M / r)`` with ``r`` the initial distance of the centres.
    """
    n = _body_count(n, 2)
    mass_ratio = check_real("mass_ratio", mass_ratio, positive=True)
    if mass_ratio > 1:
        raise ValueError(f"mass_ratio must be <= 1 (second sphere the lighter), got {mass_ratio!r}")
    separation = check_real("separation", separation, positive=True)
    impact_parameter = check_real("impact_parameter", impact_parameter, nonnegative=True)
    rel_pos = np.array([separation, impact_parameter, 0.0])
    distance = float(np.linalg.norm(rel_pos))
    if relative_speed is None:
        relative_speed = math.sqrt(2.0 / distance)
    relative_speed = check_real("relative_speed", relative_speed, nonnegative=True)
    m2 = mass_ratio / (1.0 + mass_ratio)
    n2 = min(max(1, round(n * m2)), n - 1)
    parts = []
    for count, part_seed in ((n - n2, seed), (n2, seed + 1)):
        sphere, mass = plummer(count, seed=part_seed), count / n
        parts.append((sphere.position.values, sphere.velocity.values * math.sqrt(mass),
                      np.full(count, 1.0 / n)))
    rel_vel = np.array([-relative_speed, 0.0, 0.0])
    (p1, v1, mass1), (p2, v2, mass2) = parts
    total1, total2 = mass1.sum(), mass2.sum()
    pos = np.concatenate([p1 - total2 * rel_pos, p2 + total1 * rel_pos])
    vel = np.concatenate([v1 - total2 * rel_vel, v2 + total1 * rel_vel])
    return _finish(pos, vel, np.concatenate([mass1, mass2]), initial_conditions="merger",
                   seed=seed, units=HENON_UNITS, mass_ratio=mass_ratio, separation=separation,
                   impact_parameter=impact_parameter, relative_speed=relative_speed,
                   bodies_per_sphere=[n - n2, n2])


def freeman_circular_speed(radius: Any, *, mass: float = 1.0, scale_length: float = 1.0,
                           G: float = 1.0) -> np.ndarray:
    """Circular speed in the plane of a razor-thin exponential disk (Freeman 1970).

    ``v_c^2 = 4 pi G Sigma_0 R_d y^2 [I0(y) K0(y) - I1(y) K1(y)]`` with ``y = R / (2 R_d)``
    and ``Sigma_0 = M / (2 pi R_d^2)``. The products are taken from the exponentially scaled
    Bessel functions of :mod:`scipy.special` (``I_n(y) K_n(y) = i_ne(y) k_ne(y)``), so they
    neither overflow nor underflow at any radius.
    """
    from scipy.special import i0e, i1e, k0e, k1e

    r = np.asarray(radius, dtype=float)
    y = np.maximum(r / (2.0 * scale_length), 1e-12)
    sigma0 = mass / (2.0 * math.pi * scale_length**2)
    bracket = i0e(y) * k0e(y) - i1e(y) * k1e(y)
    return np.sqrt(np.maximum(4.0 * math.pi * G * sigma0 * scale_length * y * y * bracket, 0))


def exponential_disk(
    n: int,
    seed: int = 0,
    *,
    scale_length: float = 1.0,
    scale_height: float = 0.1,
    toomre_q: float = 1.2,
    truncation: float = 10.0,
) -> xr.Dataset:
    """A rotating exponential disk of total mass 1 (G = 1): a galaxy-like stellar disk.

    Surface density ``Sigma(R) ~ exp(-R / R_d)`` (radii drawn from a Gamma(2) law), vertical
    ``sech^2(z / z0)`` profile. Mean rotation follows the thin-disk circular speed of
    :func:`freeman_circular_speed` with the epicyclic asymmetric-drift correction; radial
    dispersion ``sigma_R ~ exp(-R / 2R_d)`` scaled to Toomre's ``Q`` at ``R = 2.43 R_d``,
    ``sigma_phi = sigma_R kappa / (2 Omega)`` and ``sigma_z^2 = pi G Sigma z0`` (Hernquist
    1993). There is no dark halo: a bare disk is bar-unstable after a few rotations, which is
    physics, not a bug. Run it with softening of about ``scale_height``.

    Parameters
    ----------
    n : int
        Number of bodies (>= 1), equal masses ``1 / n``.
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    scale_length : float
        Radial scale length ``R_d`` (> 0).
    scale_height : float
        Vertical scale height ``z0`` (> 0).
    toomre_q : float
        Toomre stability parameter at ``2.43 R_d`` (>= 0; 0 gives circular orbits in the
        plane and only the vertical dispersion).
    truncation : float
        Largest radius, in scale lengths (> 1).
    """
    n = _body_count(n, 1)
    r_d = check_real("scale_length", scale_length, positive=True)
    z0 = check_real("scale_height", scale_height, positive=True)
    q = check_real("toomre_q", toomre_q, nonnegative=True)
    truncation = check_real("truncation", truncation, positive=True)
    if truncation <= 1:
        raise ValueError(f"truncation must be > 1 scale length, got {truncation!r}")
    rng = np.random.default_rng(seed)
    radius = rng.gamma(2.0, r_d, n)
    while (far := radius > truncation * r_d).any():
        radius[far] = rng.gamma(2.0, r_d, int(far.sum()))
    phi = rng.uniform(0.0, 2.0 * math.pi, n)
    z = z0 * np.arctanh(rng.uniform(-1.0, 1.0, n))
    # Rotation curve, epicyclic frequency and dispersions on a grid, interpolated to bodies.
    grid = np.linspace(1e-3 * r_d, truncation * r_d, 2048)
    v_c = freeman_circular_speed(grid, scale_length=r_d)
    kappa = np.sqrt(np.maximum(2.0 * v_c / grid * (v_c / grid + np.gradient(v_c, grid)), 0))
    sigma_surface = np.exp(-grid / r_d) / (2.0 * math.pi * r_d**2)
    i_ref = np.searchsorted(grid, 2.43 * r_d)
    sigma_r_ref = q * 3.36 * sigma_surface[i_ref] / kappa[i_ref]
    sigma_r = sigma_r_ref * np.exp(-(grid - grid[i_ref]) / (2.0 * r_d))
    omega = v_c / grid
    sigma_phi = sigma_r * kappa / (2.0 * omega)
    v_mean = np.sqrt(np.maximum(
        v_c**2 + sigma_r**2 * (1.0 - kappa**2 / (4.0 * omega**2) - 2.0 * grid / r_d), 0.0))
    sigma_z = np.sqrt(math.pi * sigma_surface * z0)
    at = {name: np.interp(radius, grid, values) for name, values in
          (("v", v_mean), ("s_r", sigma_r), ("s_phi", sigma_phi), ("s_z", sigma_z))}
    v_radial = at["s_r"] * rng.standard_normal(n)
    v_phi = at["v"] + at["s_phi"] * rng.standard_normal(n)
    cos_p, sin_p = np.cos(phi), np.sin(phi)
    pos = np.stack([radius * cos_p, radius * sin_p, z], axis=1)
    vel = np.stack([v_radial * cos_p - v_phi * sin_p, v_radial * sin_p + v_phi * cos_p,
                    at["s_z"] * rng.standard_normal(n)], axis=1)
    return _finish(pos, vel, np.full(n, 1.0 / n), initial_conditions="exponential_disk",
                   seed=seed, units=f"G = 1, M = 1, scale length = {r_d}",
                   scale_length=r_d, scale_height=z0, toomre_q=q)


GENERATORS = {
    "plummer": plummer,
    "hernquist": hernquist,
    "uniform": uniform_cube,
    "kepler": kepler,
    "cold-collapse": cold_collapse,
    "merger": merger,
    "disk": exponential_disk,
    "clumps": plummer_clumps,
}


def generate(kind: str, n: int | None = None, seed: int = 0, **params: Any) -> xr.Dataset:
    """Initial conditions by name: one of :data:`GENERATORS` (the CLI's ``--ic`` values).

    ``n`` and ``seed`` are ignored by ``kepler`` (always two bodies); ``params`` go to the
    generator as keyword arguments.
    """
    if kind not in GENERATORS:
        raise ValueError(f"initial conditions must be one of {sorted(GENERATORS)}, got {kind!r}")
    make = GENERATORS[kind]
    try:
        if kind == "kepler":
            return make(**params)
        return make(n, seed, **params)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise TypeError(f"{kind} initial conditions: {exc}") from None
        raise
