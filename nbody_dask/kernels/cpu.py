"""Numba tile-pair kernels for direct-summation gravity on the CPU.

Pure functions on structure-of-arrays tiles; no Dask, no globals. Dask supplies the
parallelism (one kernel call per tile pair), so every kernel is serial and releases the GIL.

Contract (shared with :mod:`nbody_dask.kernels.cuda`):

* inputs are 1-D contiguous arrays of one floating dtype (float32 or float64), of any
  lengths (including 0 and 1), and a softening ``eps2`` (= eps**2) of the same dtype;
* the result has the inputs' dtype: no float64 promotion in the float32 path;
* ``G`` is *not* applied: callers multiply once after the reduction;
* a source at exactly the target's position contributes zero, also with ``eps2 == 0``
  (this covers the self term ``i == j``), never NaN;
* the inner loop runs over sources and vectorises (SIMD) with one reciprocal square root
  per interaction; the outer loop runs over targets, four at a time (register blocking:
  each source is loaded once for four targets).

Numba pitfalls measured on this project's machines, and avoided here:

* ``error_model='python'`` (the default for non-parallel ``@njit``) keeps the division in
  the inner loop scalar: 16x slower. We use ``error_model='numpy'``.
* Python float literals are float64 and silently promote float32 arithmetic (2.3x slower).
  Constants are therefore taken from the inputs' dtype (``one`` below), never written as
  literals.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["accel_tile", "accel_potential_tile", "tile_pair_forces", "direct_sum_reference"]

_JIT = dict(nogil=True, cache=True, fastmath=True, error_model="numpy", boundscheck=False)


@njit(**_JIT)
def _inv_r3(dx, dy, dz, eps2, zero, one):
    """1 / r^3 of one softened separation, zero for coincident bodies."""
    r2 = dx * dx + dy * dy + dz * dz + eps2
    inv = one / np.sqrt(r2) if r2 > zero else zero
    return inv * inv * inv


@njit(**_JIT)
def accel_tile(xt, yt, zt, xs, ys, zs, ms, eps2):
    """Partial accelerations of a target tile due to a source tile (G = 1).

    Parameters
    ----------
    xt, yt, zt : ndarray, shape (nt,)
        Target positions.
    xs, ys, zs, ms : ndarray, shape (ns,)
        Source positions and masses.
    eps2 : float32 or float64
        Squared Plummer softening length, in the dtype of the arrays.

    Returns
    -------
    ndarray, shape (3, nt)
        ``sum_j m_j (r_j - r_i) / (|r_j - r_i|^2 + eps2)^(3/2)`` for every target ``i``.
    """
    nt = xt.shape[0]
    ns = xs.shape[0]
    out = np.zeros((3, nt), dtype=xt.dtype)
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    n4 = nt - nt % 4
    for i in range(0, n4, 4):
        x0, y0, z0 = xt[i], yt[i], zt[i]
        x1, y1, z1 = xt[i + 1], yt[i + 1], zt[i + 1]
        x2, y2, z2 = xt[i + 2], yt[i + 2], zt[i + 2]
        x3, y3, z3 = xt[i + 3], yt[i + 3], zt[i + 3]
        ax0 = ay0 = az0 = ax1 = ay1 = az1 = zero
        ax2 = ay2 = az2 = ax3 = ay3 = az3 = zero
        for j in range(ns):
            xj, yj, zj, mj = xs[j], ys[j], zs[j], ms[j]
            dx, dy, dz = xj - x0, yj - y0, zj - z0
            s = mj * _inv_r3(dx, dy, dz, eps2, zero, one)
            ax0 += s * dx
            ay0 += s * dy
            az0 += s * dz
            dx, dy, dz = xj - x1, yj - y1, zj - z1
            s = mj * _inv_r3(dx, dy, dz, eps2, zero, one)
            ax1 += s * dx
            ay1 += s * dy
            az1 += s * dz
            dx, dy, dz = xj - x2, yj - y2, zj - z2
            s = mj * _inv_r3(dx, dy, dz, eps2, zero, one)
            ax2 += s * dx
            ay2 += s * dy
            az2 += s * dz
            dx, dy, dz = xj - x3, yj - y3, zj - z3
            s = mj * _inv_r3(dx, dy, dz, eps2, zero, one)
            ax3 += s * dx
            ay3 += s * dy
            az3 += s * dz
        out[0, i], out[1, i], out[2, i] = ax0, ay0, az0
        out[0, i + 1], out[1, i + 1], out[2, i + 1] = ax1, ay1, az1
        out[0, i + 2], out[1, i + 2], out[2, i + 2] = ax2, ay2, az2
        out[0, i + 3], out[1, i + 3], out[2, i + 3] = ax3, ay3, az3
    for i in range(n4, nt):
        xi, yi, zi = xt[i], yt[i], zt[i]
        ax = ay = az = zero
        for j in range(ns):
            dx, dy, dz = xs[j] - xi, ys[j] - yi, zs[j] - zi
            s = ms[j] * _inv_r3(dx, dy, dz, eps2, zero, one)
            ax += s * dx
            ay += s * dy
            az += s * dz
        out[0, i], out[1, i], out[2, i] = ax, ay, az
    return out


@njit(**_JIT)
def accel_potential_tile(xt, yt, zt, xs, ys, zs, ms, eps2, diagonal):
    """Partial accelerations and potentials of a target tile due to a source tile.

    Used on snapshot steps, where the potential energy is needed as well.

    Parameters
    ----------
    xt, yt, zt : ndarray, shape (nt,)
        Target positions.
    xs, ys, zs, ms : ndarray, shape (ns,)
        Source positions and masses.
    eps2 : float32 or float64
        Squared Plummer softening length, in the dtype of the arrays.
    diagonal : bool
        True when targets and sources are the same tile: the self term ``j == i`` is then
        left out of the potential (with ``eps2 > 0`` it would add ``-m_i / eps``).

    Returns
    -------
    ndarray, shape (4, nt)
        Rows 0-2 as :func:`accel_tile`; row 3 the potential
        ``-sum_{j != i} m_j / sqrt(|r_j - r_i|^2 + eps2)`` (G = 1).
    """
    nt = xt.shape[0]
    ns = xs.shape[0]
    out = np.zeros((4, nt), dtype=xt.dtype)
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    for i in range(nt):
        xi, yi, zi = xt[i], yt[i], zt[i]
        ax = ay = az = phi = zero
        for j in range(ns):
            dx, dy, dz = xs[j] - xi, ys[j] - yi, zs[j] - zi
            r2 = dx * dx + dy * dy + dz * dz + eps2
            inv = one / np.sqrt(r2) if r2 > zero else zero
            mi = ms[j] * inv
            s = mi * inv * inv
            ax += s * dx
            ay += s * dy
            az += s * dz
            phi -= mi
        if diagonal and eps2 > zero:
            # Remove the self term -m_i/eps that the vectorised loop included.
            phi += ms[i] / np.sqrt(eps2)
        out[0, i], out[1, i], out[2, i], out[3, i] = ax, ay, az, phi
    return out


def tile_pair_forces(target_position, source_position, source_mass, eps2, with_potential,
                     diagonal=False):
    """Partial forces (3 or 4, nt) of a tile pair from (3, n) position arrays (G = 1).

    The entry point of the task graph, shared with :mod:`nbody_dask.kernels.cuda`; row 3
    holds the potential when ``with_potential``.
    """
    xt, yt, zt = target_position
    xs, ys, zs = source_position
    if with_potential:
        return accel_potential_tile(xt, yt, zt, xs, ys, zs, source_mass, eps2, diagonal)
    return accel_tile(xt, yt, zt, xs, ys, zs, source_mass, eps2)


def direct_sum_reference(position, mass, softening=0.0, G=1.0):
    """Independent float64 NumPy direct sum: accelerations and potentials.

    The oracle the tests compare against. O(N^2) memory: keep N modest.

    Parameters
    ----------
    position : array_like, shape (n, 3)
    mass : array_like, shape (n,)
    softening : float
        Plummer softening length eps.
    G : float
        Gravitational constant.

    Returns
    -------
    acc : ndarray, shape (n, 3)
    phi : ndarray, shape (n,)
        Potential of each body, self term excluded.
    """
    pos = np.asarray(position, dtype=np.float64)
    m = np.asarray(mass, dtype=np.float64)
    d = pos[None, :, :] - pos[:, None, :]  # d[i, j] = r_j - r_i
    r2 = np.einsum("ijk,ijk->ij", d, d) + float(softening) ** 2
    np.fill_diagonal(r2, np.inf)  # self term: zero force, excluded from the potential
    with np.errstate(divide="ignore"):
        inv = np.where(r2 > 0, 1.0 / np.sqrt(r2), 0.0)
    acc = G * np.einsum("ij,ijk->ik", m[None, :] * inv**3, d)
    phi = -G * (inv * m[None, :]).sum(axis=1)
    return acc, phi
