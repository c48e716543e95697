"""Ewald sums: exact forces and potentials in a periodic cube, in float64 (no Dask).

Gravity in a periodic box of side ``L`` with the mean density subtracted (the uniform
background of every cosmological code) is split with a Gaussian of width ``1 / alpha``:

* a real-space sum over the images of every source within ``REAL_RANGE / alpha``, with the
  short-range law of :func:`~nbody_dask.kernels.law.short_range` (``r_s = 1 / (2 alpha)``);
* a reciprocal-space sum over wave vectors ``k = 2 pi n / L``, ``n != 0``, with
  ``|k| <= K_RANGE * alpha``: ``(4 pi / V) exp(-k^2 / 4 alpha^2) / k^2`` times the
  structure factor ``S(k) = sum_j m_j exp(i k . x_j)`` (:func:`structure_factors`), which
  costs ``N x n_k`` once and is a sum over sources (so tiles can add theirs);
* a body's own smooth part removed (``-2 alpha m / sqrt(pi)`` in the potential) and the
  background's (``-pi M / (alpha^2 V)``, ``M`` the total mass), so that the potential does
  not depend on ``alpha``.

Both truncations leave terms below ``exp(-36)`` of the leading ones, so the result is
independent of ``alpha`` to round-off (tests/test_periodic.py checks 1e-10 for ``alpha L``
of 4 to 8). A body's potential includes its own images: a lone body has
``2.8372974794806 m / L`` (the simple cubic lattice's Madelung-type constant, with G = 1).

Plummer softening, where given, applies to the nearest image of each pair only (the others
are at least ``L / 2`` away). Coincident bodies (``r = 0``) have no pair term, as in the
direct kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .law import short_range

__all__ = ["REAL_RANGE", "K_RANGE", "default_alpha", "wave_vectors", "structure_factors",
           "real_space", "reciprocal_space", "ewald_forces"]

#: Real-space images are summed out to ``REAL_RANGE / alpha`` (erfc(6) = 2e-17).
REAL_RANGE = 6.0
#: Wave vectors are summed out to ``|k| = K_RANGE * alpha`` (exp(-k^2/4 alpha^2) < 1e-16).
K_RANGE = 12.2
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def default_alpha(box: float) -> float:
    """The Ewald splitting parameter used unless one is given: ``6 / L`` (the real-space
    sum then needs about 4 images of each source on average, the reciprocal about 3,600
    wave vectors)."""
    return 6.0 / box


def wave_vectors(box: float, alpha: float) -> np.ndarray:
    """Integer vectors ``n`` (shape (k, 3), int64) of half of k-space (one of each pair
    ``+-n``) with ``0 < 2 pi |n| / L <= K_RANGE * alpha``, in a fixed order."""
    top = int(math.ceil(K_RANGE * alpha * box / (2 * math.pi)))
    axis = np.arange(-top, top + 1)
    n = np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)
    upper = (n[:, 0] > 0) | ((n[:, 0] == 0) & ((n[:, 1] > 0) | ((n[:, 1] == 0) & (n[:, 2] > 0))))
    inside = (n * n).sum(axis=1) <= top * top
    return np.ascontiguousarray(n[upper & inside], dtype=np.int64)


@njit(cache=True)
def _phases(x, y, z, box, top):
    """``exp(2 pi i n x / L)`` for n in ``-top..top`` along each axis: shape (3, 2 top + 1)."""
    out = np.empty((3, 2 * top + 1), dtype=np.complex128)
    for a in range(3):
        v = x if a == 0 else (y if a == 1 else z)
        base = np.exp(2j * np.pi * v / box)
        out[a, top] = 1.0
        for n in range(1, top + 1):
            out[a, top + n] = out[a, top + n - 1] * base
            out[a, top - n] = np.conj(out[a, top + n])
    return out


@njit(parallel=True, cache=True)
def structure_factors(x, y, z, m, box, vectors):
    """``S(k) = sum_j m_j exp(i k . x_j)`` for the ``vectors`` of :func:`wave_vectors`
    (complex128, shape (k,)), each summed over the bodies in their order."""
    nk = vectors.shape[0]
    top = int(np.abs(vectors).max()) if nk else 0
    n = x.shape[0]
    block = 1024
    out = np.zeros(nk, dtype=np.complex128)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        phases = np.empty((hi - lo, 3, 2 * top + 1), dtype=np.complex128)
        for j in prange(hi - lo):
            phases[j] = _phases(float(x[lo + j]), float(y[lo + j]), float(z[lo + j]), box,
                                top)
        for k in prange(nk):
            a, b, c = vectors[k, 0] + top, vectors[k, 1] + top, vectors[k, 2] + top
            s = out[k]
            for j in range(hi - lo):
                s += float(m[lo + j]) * phases[j, 0, a] * phases[j, 1, b] * phases[j, 2, c]
            out[k] = s
    return out


@njit(parallel=True, cache=True)
def real_space(tx, ty, tz, sx, sy, sz, sm, box, alpha, eps2, same):
    """Real-space part (accelerations and potential, shape (4, nt), float64, G = 1) on the
    targets from every image of the sources within ``REAL_RANGE / alpha``, with the
    softening of the nearest image and a body's own smooth part (``r = 0``) removed.
    ``same``: targets and sources are one set (target ``i`` is source ``i``: no softened
    self term)."""
    nt, ns = tx.shape[0], sx.shape[0]
    out = np.zeros((4, nt))
    cut = REAL_RANGE / alpha
    cut2 = cut * cut
    images = int(math.ceil(cut / box + 0.5))
    inv_2rs = alpha  # r_s = 1 / (2 alpha)
    self_term = _TWO_OVER_SQRT_PI * alpha
    for i in prange(nt):
        ax = ay = az = psi = 0.0
        xi, yi, zi = float(tx[i]), float(ty[i]), float(tz[i])
        for j in range(ns):
            m = float(sm[j])
            dx0, dy0, dz0 = float(sx[j]) - xi, float(sy[j]) - yi, float(sz[j]) - zi
            dx0 -= box * np.floor(dx0 / box + 0.5)
            dy0 -= box * np.floor(dy0 / box + 0.5)
            dz0 -= box * np.floor(dz0 / box + 0.5)
            for a in range(-images, images + 1):
                for b in range(-images, images + 1):
                    for c in range(-images, images + 1):
                        dx, dy, dz = dx0 + a * box, dy0 + b * box, dz0 + c * box
                        r2 = dx * dx + dy * dy + dz * dz
                        if r2 > cut2:
                            continue
                        if r2 == 0.0:
                            psi -= m * self_term
                            continue
                        r = np.sqrt(r2)
                        g, e = short_range(r, inv_2rs, _TWO_OVER_SQRT_PI)
                        f = m * g / (r2 * r)
                        ax += f * dx
                        ay += f * dy
                        az += f * dz
                        psi += m * e / r
            r2 = dx0 * dx0 + dy0 * dy0 + dz0 * dz0
            if eps2 > 0.0 and r2 > 0.0 and not (same and i == j):
                r = np.sqrt(r2)
                soft = 1.0 / np.sqrt(r2 + eps2)
                f = m * (soft * soft * soft - 1.0 / (r2 * r))
                ax += f * dx0
                ay += f * dy0
                az += f * dz0
                psi += m * (soft - 1.0 / r)
        out[0, i], out[1, i], out[2, i], out[3, i] = ax, ay, az, -psi
    return out


@njit(parallel=True, cache=True)
def reciprocal_space(tx, ty, tz, box, alpha, vectors, factors, total_mass):
    """Reciprocal-space part (shape (4, nt), float64, G = 1) on the targets from the
    ``factors`` of all sources (:func:`structure_factors` over ``vectors``), with the
    background's potential ``-pi M / (alpha^2 V)``."""
    nt, nk = tx.shape[0], vectors.shape[0]
    out = np.zeros((4, nt))
    volume = box * box * box
    top = int(np.abs(vectors).max()) if nk else 0
    coefficient = np.empty(nk)
    scale = 2 * np.pi / box  # k = scale n
    for k in range(nk):
        kx, ky, kz = scale * vectors[k, 0], scale * vectors[k, 1], scale * vectors[k, 2]
        k2 = kx * kx + ky * ky + kz * kz
        # both halves of k-space: 2 x (4 pi / V) exp(-k^2 / 4 alpha^2) / k^2
        coefficient[k] = 8 * np.pi / volume * np.exp(-k2 / (4 * alpha * alpha)) / k2
    background = np.pi * total_mass / (alpha * alpha * volume)
    for i in prange(nt):
        phases = _phases(float(tx[i]), float(ty[i]), float(tz[i]), box, top)
        ax = ay = az = psi = 0.0
        for k in range(nk):
            a, b, c = vectors[k, 0] + top, vectors[k, 1] + top, vectors[k, 2] + top
            p = np.conj(phases[0, a] * phases[1, b] * phases[2, c]) * factors[k]
            f = coefficient[k] * p.imag  # sum_j m_j sin(k . (x_j - x))
            ax += f * scale * vectors[k, 0]
            ay += f * scale * vectors[k, 1]
            az += f * scale * vectors[k, 2]
            psi += coefficient[k] * p.real
        out[0, i], out[1, i], out[2, i], out[3, i] = ax, ay, az, -(psi - background)
    return out


def ewald_forces(target: np.ndarray, source: np.ndarray, mass: np.ndarray, box: float,
                 softening: float = 0.0, alpha: float | None = None,
                 same: bool = False) -> np.ndarray:
    """Accelerations and potentials (G = 1, float64, shape (4, nt)) on ``target`` bodies due
    to ``source`` bodies and all their periodic images in a cube of side ``box``, with the
    mean density subtracted.

    Parameters
    ----------
    target, source : ndarray, shape (3, n)
        Positions (any real dtype; computed in float64).
    mass : ndarray, shape (ns,)
        Source masses.
    box : float
        Side of the periodic cube.
    softening : float
        Plummer softening of the nearest image of each pair.
    alpha : float, optional
        Ewald splitting parameter (default :func:`default_alpha`); the result does not
        depend on it to round-off.
    same : bool
        ``target`` is ``source`` (body ``i`` feels no softened self term).

    Returns
    -------
    ndarray, shape (4, nt)
        Accelerations in rows 0-2, the potential in row 3. The potential of ``target`` in
        the field of every source, with a target's own images and its own smooth part
        removed where it is a source too (``r = 0``).
    """
    alpha = default_alpha(box) if alpha is None else float(alpha)
    t = np.asarray(target, dtype=np.float64)
    s = np.asarray(source, dtype=np.float64)
    m = np.asarray(mass, dtype=np.float64)
    real = real_space(t[0], t[1], t[2], s[0], s[1], s[2], m, float(box), alpha,
                      float(softening) ** 2, bool(same))
    vectors = wave_vectors(box, alpha)
    factors = structure_factors(s[0], s[1], s[2], m, float(box), vectors)
    return real + reciprocal_space(t[0], t[1], t[2], float(box), alpha, vectors, factors,
                                   float(m.sum()))
