"""Cosmological initial conditions by second-order Lagrangian perturbation theory (2LPT), as a
Dask graph.

:func:`cosmological_ics` puts ``n_side^3`` bodies on a grid of a periodic box and moves them
by the 2LPT displacements of a Gaussian random field with the linear power spectrum
(Scoccimarro 1998; Crocce, Pueblas & Scoccimarro 2006)::

    x = q - D1 grad phi1 + D2 grad phi2,       v = a H (-f1 D1 grad phi1 + f2 D2 grad phi2)

with ``laplacian phi1 = delta`` (the linear density contrast today) and
``laplacian phi2 = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2)``, ``D1, D2, f1, f2`` from
:meth:`nbody_dask.cosmology.Background.growth`.

The graph: white noise plane by plane along the first axis, each plane's from the seed and
its index alone (``numpy.random.SeedSequence([seed, plane])``), so the same seed gives the
same field whatever the slabs and workers; its transform by the distributed FFT
(:mod:`nbody_dask.meshfft`); the spectrum scaled to ``sqrt(P(k))`` (with
``fixed_amplitude``, every mode's amplitude set to exactly that; ``paired`` flips every
phase: the partner run of Angulo & Pontzen 2016); twelve inverse transforms and one forward
one for the displacements and the second-order source, all chunked in slabs; bodies built
slab by slab. No task holds more than a slab of a field. For a given number of slabs the
result is bit-identical on any cluster; across slab counts it agrees to round-off.

Units are those of :func:`nbody_dask.cosmology.unit_system`: comoving positions in Mpc/h,
peculiar velocities in 100 km/s, masses such that the mean density is ``3 Om0 / 8 pi``.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from . import meshfft
from ._validate import check_int, check_real
from .cosmology import (Background, PowerSpectrum, as_cosmology, linear_power, mean_density,
                        to_json, unit_system)
from .kernels import pm

__all__ = ["cosmological_ics"]

#: Most mesh points a slab of the generation holds (float64 fields: 32 MiB).
_SLAB_POINTS = 1 << 22


def cosmological_ics(n_side: int, box_size: float, cosmology: Any = "Planck18", *,
                     z_start: float = 49.0, seed: int = 0,
                     power: PowerSpectrum | str | None = None,
                     sigma8: float | None = None, n_s: float | None = None,
                     fixed_amplitude: bool = False, paired: bool = False,
                     slabs: int | None = None) -> xr.Dataset:
    """A periodic box of ``n_side^3`` bodies at redshift ``z_start``, by 2LPT.

    Parameters
    ----------
    n_side : int
        Bodies per side of the grid (>= 2); the field lives on the same grid.
    box_size : float
        Side of the box in Mpc/h.
    cosmology : astropy FLRW, str or mapping
        See :func:`nbody_dask.cosmology.as_cosmology`; ``"Planck18"`` by default.
    z_start : float
        Starting redshift (> 0); 49 by default (2LPT: start at z >= 20-50).
    seed : int
        Seed of the white noise (>= 0).
    power : callable or {"eisenstein-hu", "camb"}, optional
        The linear power spectrum today, ``P(k)`` in (Mpc/h)^3 with ``k`` in h/Mpc, or the
        name of one that :func:`nbody_dask.cosmology.linear_power` computes for the
        cosmology with ``sigma8`` and ``n_s``: colossus's Eisenstein & Hu fit (the default)
        or CAMB's Boltzmann solution (the ``camb`` extra).
    sigma8, n_s : float, optional
        The default spectrum's normalisation and slope (default: the cosmology's metadata).
    fixed_amplitude : bool
        Every mode with exactly the spectrum's amplitude (random phases only): the sample
        variance of ``P(k)`` vanishes.
    paired : bool
        Every phase shifted by pi: with ``fixed_amplitude``, the partner of the unpaired run.
    slabs : int, optional
        Slabs the graph cuts the grid into (at most ``n_side``); by default slabs of at
        most 2^22 points. Runs with another count agree to round-off.

    Returns
    -------
    xarray.Dataset
        ``position(body, axis)``, ``velocity(body, axis)``, ``mass(body)`` in code units
        (lazy: Dask arrays chunked by slab), the body ids ``0 .. n_side^3 - 1`` as a lazy
        coordinate without an index (``set_xindex("body")`` adds one, held in memory), the
        scalar coordinate ``time`` (the scale factor), attributes ``box_size``,
        ``redshift``, ``cosmology`` (JSON) and the unit system. Ready for
        ``simulate(ics, cosmology=..., box_size=...)``.

    Examples
    --------
    >>> ics = nbody_dask.cosmological_ics(64, 256.0, z_start=49, seed=1)  # doctest: +SKIP
    """
    n = check_int("n_side", n_side, 2)
    box = check_real("box_size", box_size, positive=True)
    z_start = check_real("z_start", z_start, positive=True)
    seed = check_int("seed", seed, 0)
    for name, flag in (("fixed_amplitude", fixed_amplitude), ("paired", paired)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if slabs is None:
        slabs = max(1, min(n, -(-n**3 // _SLAB_POINTS)))
    slabs = check_int("slabs", slabs, 1)
    if slabs > n:
        raise ValueError(f"slabs must be <= n_side ({n}), got {slabs!r}")
    cosmo = as_cosmology(cosmology)
    spectrum = linear_power(cosmo, power, sigma8=sigma8, n_s=n_s)
    a = 1 / (1 + z_start)
    background = Background(cosmo)
    growth = background.growth(a)
    d1, f1, d2, f2 = (float(v[0]) for v in (growth.d1, growth.f1, growth.d2, growth.f2))
    hubble = float(background.efunc(a))

    bounds = [(n * j // slabs, n * (j + 1) // slabs) for j in range(slabs)]
    noise = da.concatenate([da.from_delayed(dask.delayed(_noise)(seed, lo, hi, n),
                                            shape=(hi - lo, n, n), dtype=np.float64)
                            for lo, hi in bounds], axis=0)
    chunks = noise.chunks
    delta = meshfft.rfftn(noise).map_blocks(_field_block, n, box, spectrum, fixed_amplitude,
                                            paired, dtype=np.complex128)
    phi1 = delta.map_blocks(_inverse_laplacian, n, box, dtype=np.complex128)
    first = [meshfft.irfftn(phi1.map_blocks(_derivatives, n, box, (i,), dtype=np.complex128),
                            n, chunks) for i in range(3)]
    second = {pair: meshfft.irfftn(phi1.map_blocks(_derivatives, n, box, pair,
                                                   dtype=np.complex128), n, chunks)
              for pair in ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))}
    source = da.map_blocks(_second_order_source, *second.values(), dtype=np.float64)
    phi2 = meshfft.rfftn(source).map_blocks(_inverse_laplacian, n, box, dtype=np.complex128)
    grad2 = [meshfft.irfftn(phi2.map_blocks(_derivatives, n, box, (i,), dtype=np.complex128),
                            n, chunks) for i in range(3)]
    # grad phi1 and grad phi2 on the grid; displacement -D1 grad phi1 + D2 grad phi2
    disp1 = da.stack(first, axis=-1).reshape((n**3, 3)).rechunk({1: 3})
    disp2 = da.stack(grad2, axis=-1).reshape((n**3, 3)).rechunk({1: 3})
    psi1, psi2 = -d1 * disp1, d2 * disp2
    position = (psi1 + psi2).map_blocks(_place, n, box, dtype=np.float64)
    velocity = a * hubble * (f1 * psi1 + f2 * psi2)
    # the masses as the positions are chunked, made where they are used: n^3 of them
    # (8 GiB at 1024^3) never sit in this process
    mass = da.full(n**3, mean_density(cosmo) * box**3 / n**3, dtype=np.float64,
                   chunks=(position.chunks[0],))
    # the ids too, unindexed: an index would hold them here, 8 bytes a body
    ids = xr.Coordinates({"body": ("body", da.arange(n**3, dtype=np.int64,
                                                      chunks=position.chunks[0]))}, indexes={})
    units = unit_system(cosmo)
    return xr.Dataset(
        {"position": (("body", "axis"), position),
         "velocity": (("body", "axis"), velocity),
         "mass": ("body", mass)},
        coords={"axis": np.array(["x", "y", "z"], dtype=object),
                "time": ((), a, {"long_name": "scale factor"})},
        attrs={"box_size": box, "redshift": z_start, "cosmology": to_json(cosmo),
               "n_side": n, "seed": seed, "fixed_amplitude": int(fixed_amplitude),
               "paired": int(paired), "initial_conditions": "2LPT",
               "units": "comoving Mpc/h, peculiar velocity in 100 km/s, time 1/H0, G = 1",
               **units.attrs()}).assign_coords(ids)


def _noise(seed: int, lo: int, hi: int, n: int) -> np.ndarray:
    """Unit white noise on planes ``lo .. hi - 1``, each from the seed and its index."""
    out = np.empty((hi - lo, n, n))
    for plane in range(lo, hi):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, plane])))
        out[plane - lo] = rng.standard_normal((n, n))
    return out


def _wave_numbers(n: int, box: float, block_info: dict) -> tuple[np.ndarray, ...]:
    where = tuple(block_info[0]["array-location"])
    return pm.wave_numbers(n, box, np.float64, where), where


def _field_block(block: np.ndarray, n: int, box: float, spectrum: PowerSpectrum,
                 fixed: bool, paired: bool, block_info=None) -> np.ndarray:
    """One chunk of the noise's spectrum turned into the linear density contrast's: times
    ``sqrt(P(k) n^3 / V)`` (with ``fixed``, the noise's amplitude set to its mean), phases
    flipped when ``paired``; the mean and the Nyquist planes zero."""
    (kx, ky, kz), where = _wave_numbers(n, box, block_info)
    k = np.sqrt(kx * kx + ky * ky + kz * kz)
    if fixed:
        modulus = np.abs(block)
        block = np.where(modulus > 0, block / np.where(modulus > 0, modulus, 1.0),
                         0.0) * np.sqrt(n**3)
    out = block * np.sqrt(spectrum(k) * n**3 / box**3)
    if paired:
        out = -out
    if n % 2 == 0:
        for axis, k_axis in enumerate((kx, ky, kz)):
            index = np.arange(*where[axis]).reshape(k_axis.shape)
            out = np.where(index == n // 2, 0, out)
    return np.where(k == 0, 0, out)


def _inverse_laplacian(block: np.ndarray, n: int, box: float, block_info=None) -> np.ndarray:
    """``-block / k^2`` (zero at ``k = 0``): the potential whose Laplacian is ``block``."""
    (kx, ky, kz), _ = _wave_numbers(n, box, block_info)
    k2 = kx * kx + ky * ky + kz * kz
    return np.where(k2 == 0, 0, -block / np.where(k2 == 0, 1.0, k2))


def _derivatives(block: np.ndarray, n: int, box: float, axes: tuple,
                 block_info=None) -> np.ndarray:
    """The spectrum of the derivative along ``axes`` (one or two) of a field."""
    k, _ = _wave_numbers(n, box, block_info)
    out = block
    for axis in axes:
        out = out * (1j * k[axis])
    return out


def _second_order_source(xx, yy, zz, xy, xz, yz) -> np.ndarray:
    """``sum_{i<j} (phi_ii phi_jj - phi_ij^2)``."""
    return xx * yy + xx * zz + yy * zz - xy * xy - xz * xz - yz * yz


def _place(displacement: np.ndarray, n: int, box: float, block_info=None) -> np.ndarray:
    """Positions of a chunk of bodies: their grid points ``(i, j, k) box / n`` (body
    ``i n^2 + j n + k``) plus ``displacement``, wrapped into ``[0, box)``."""
    lo, hi = block_info[0]["array-location"][0]
    body = np.arange(lo, hi)
    grid = np.stack([body // (n * n), (body // n) % n, body % n], axis=1) * (box / n)
    out = np.mod(grid + displacement, box)
    out[out >= box] = 0.0
    return out
