"""Numba tile-pair kernels for direct-summation gravity on the CPU.

Pure functions on structure-of-arrays tiles; no Dask, no globals. Dask supplies the
parallelism (one kernel call per tile pair), so every kernel is serial and releases the GIL.

Contract (shared with :mod:`nbody_dask.kernels.cuda`):

* inputs are 1-D contiguous arrays of one floating dtype (float32 or float64), of any
  lengths (including 0 and 1), and a softening ``eps2`` (= eps**2) of the same dtype;
* the result has the inputs' dtype: no float64 promotion in the float32 path;
* ``G`` is *not* applied: callers multiply once after the reduction;
* a source at exactly the target's position contributes zero, also with ``eps2 == 0``
  (this covers the self term ``i == j``), never NaN: the softened law of
  :mod:`nbody_dask.kernels.law`, written once and inlined here;
* the inner loop runs over sources and vectorises (SIMD) with one reciprocal square root
  per interaction; the outer loop runs over targets, four at a time (register blocking:
  each source is loaded once for four targets).

Numba pitfalls avoided here (their cost is measured in docs/performance.md):

* ``error_model='python'`` (the default for non-parallel ``@njit``) keeps the division in
  the inner loop scalar. We use ``error_model='numpy'``.
* Python float literals are float64 and silently promote float32 arithmetic. Constants are
  therefore taken from the inputs' dtype (``one`` below), never written as literals.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .law import JIT_OPTIONS as _JIT
from .law import inverse_distance
from .stack import align_stack

__all__ = ["accel_tile", "accel_potential_tile", "tile_pair_forces", "symmetric_pair_forces",
           "self_tile_forces", "accel_rate_tile",
           "SYMMETRIC_CHUNK"]

@njit(**_JIT)
def _inv_r3(dx, dy, dz, eps2, zero, one):
    """1 / r^3 of one softened separation, zero for coincident bodies."""
    inv = inverse_distance(dx, dy, dz, eps2, zero, one)
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
    align_stack()
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
def accel_potential_tile(xt, yt, zt, xs, ys, zs, ms, eps2, diagonal, first=0):
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
        True when the targets are among the sources: the self term of target ``i``, source
        ``first + i``, then enters the sums with zero mass, so the potential leaves it out
        exactly (with ``eps2 > 0`` it would add ``-m_i / eps``) and a lone body's potential
        is exactly zero.
    first : int
        Index in the sources of the first target when ``diagonal`` (0: the same tile; a
        target block cut from a tile starts at its offset).

    Returns
    -------
    ndarray, shape (4, nt)
        Rows 0-2 as :func:`accel_tile`; row 3 the potential
        ``-sum_{j != i} m_j / sqrt(|r_j - r_i|^2 + eps2)`` (G = 1).
    """
    align_stack()
    nt = xt.shape[0]
    ns = xs.shape[0]
    out = np.zeros((4, nt), dtype=xt.dtype)
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    for i in range(nt):
        xi, yi, zi = xt[i], yt[i], zt[i]
        own = first + i if diagonal else -1
        ax = ay = az = phi = zero
        for j in range(ns):
            dx, dy, dz = xs[j] - xi, ys[j] - yi, zs[j] - zi
            inv = inverse_distance(dx, dy, dz, eps2, zero, one)
            # the self term enters with zero mass (a select, still vectorised): nothing is
            # subtracted afterwards, so no rounding of 1/sqrt(eps2) is left behind
            mi = (zero if j == own else ms[j]) * inv
            s = mi * inv * inv
            ax += s * dx
            ay += s * dy
            az += s * dz
            phi -= mi
        out[0, i], out[1, i], out[2, i], out[3, i] = ax, ay, az, phi
    return out


@njit(**_JIT)
def accel_rate_tile(xt, yt, zt, mt, own, xs, ys, zs, ms, eps2, with_potential):
    """Partial accelerations (and potentials) of a target tile due to a source tile, and
    the sum of the squared pairwise free-fall rates: individual time steps' criterion.

    Parameters
    ----------
    xt, yt, zt, mt : ndarray, shape (nt,)
        Target positions and masses.
    own : ndarray of int64, shape (nt,)
        Each target's index among the sources, -1 where it is not one: its self term enters
        the potential with zero mass (no ``-m / eps``). The rates leave out sources at the
        target's very position, the self term among them (no ``2 m / eps^3``): a float
        test, so the loop stays vectorised.
    xs, ys, zs, ms : ndarray, shape (ns,)
        Source positions and masses.
    eps2 : float32 or float64
        Squared Plummer softening length, in the dtype of the arrays.
    with_potential : bool
        Add the potential row.

    Returns
    -------
    ndarray, shape (4 or 5, nt)
        Rows 0-2 the accelerations as :func:`accel_tile`, then the potential when
        ``with_potential``, and last ``sum_j ((m_i + m_j) / (|r_j - r_i|^2 + eps2)^(3/2))^2``:
        the squares of the inverse squared free-fall times of the target's pairs (G = 1),
        whose fourth root is a smooth maximum of their inverse times (the closest encounter
        dominates: the terms fall as ``r^-6``). A sum, so the tile pairs' partials add up
        like the forces.
    """
    align_stack()
    nt = xt.shape[0]
    ns = xs.shape[0]
    out = np.zeros((5 if with_potential else 4, nt), dtype=xt.dtype)
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    for i in range(nt):
        xi, yi, zi, mi, o = xt[i], yt[i], zt[i], mt[i], own[i]
        ax = ay = az = phi = rate2 = zero
        if with_potential:
            for j in range(ns):
                dx, dy, dz = xs[j] - xi, ys[j] - yi, zs[j] - zi
                inv = inverse_distance(dx, dy, dz, eps2, zero, one)
                inv3 = inv * inv * inv
                s = ms[j] * inv3
                ax += s * dx
                ay += s * dy
                az += s * dz
                phi -= (zero if j == o else ms[j]) * inv
                d2 = dx * dx + dy * dy + dz * dz
                pair = (mi + ms[j] if d2 > zero else zero) * inv3
                rate2 += pair * pair
        else:
            for j in range(ns):
                dx, dy, dz = xs[j] - xi, ys[j] - yi, zs[j] - zi
                inv = inverse_distance(dx, dy, dz, eps2, zero, one)
                inv3 = inv * inv * inv
                s = ms[j] * inv3
                ax += s * dx
                ay += s * dy
                az += s * dz
                d2 = dx * dx + dy * dy + dz * dz
                pair = (mi + ms[j] if d2 > zero else zero) * inv3
                rate2 += pair * pair
        out[0, i], out[1, i], out[2, i] = ax, ay, az
        if with_potential:
            out[3, i] = phi
        out[-1, i] = rate2
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


#: Sources per block of the symmetric kernel: the reactions it accumulates on the sources
#: (3-4 rows of this many) stay in L1/L2 while all targets pass over them.
SYMMETRIC_CHUNK = 4096


@njit(inline="always", **_JIT)
def _symmetric(xt, yt, zt, mt, xs, ys, zs, ms, eps2, with_potential, self_pairs):
    """(on_targets, on_sources), each (3 or 4, n): both sides of every pair at once.

    With ``self_pairs`` the targets are the sources and each pair ``i < j`` is done once.
    Inlined into the four kernels below with constant flags, so no branch is left in the
    inner loop (and each kernel has its own name: Numba's on-disk cache tells closures
    apart by name, not by their captured values, so a factory of closures is not safe).
    """
    rows = 4 if with_potential else 3
    nt = xt.shape[0]
    ns = xs.shape[0]
    out_t = np.zeros((rows, nt), dtype=xt.dtype)
    out_s = np.zeros((rows, ns), dtype=xt.dtype)
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    # targets four at a time; past the end, lanes repeat the last target with zero mass
    # (they add nothing to the sources and their own sums are dropped)
    for c0 in range(0, ns, SYMMETRIC_CHUNK):
        c1 = min(ns, c0 + SYMMETRIC_CHUNK)
        for i in range(0, min(nt, c1) if self_pairs else nt, 4):
            # self pairs: sources past this group of four only (the rest come later)
            lo = max(c0, i + 4) if self_pairs else c0
            if lo >= c1:
                continue
            # slices, so that the inner loop counts from 0 (vectorises; an offset start
            # leaves Numba's negative-index handling in the loop and it stays scalar)
            bx, by, bz, bp = out_s[0, lo:c1], out_s[1, lo:c1], out_s[2, lo:c1], \
                out_s[rows - 1, lo:c1]
            cx, cy, cz, cm = xs[lo:c1], ys[lo:c1], zs[lo:c1], ms[lo:c1]
            i1, i2, i3 = min(i + 1, nt - 1), min(i + 2, nt - 1), min(i + 3, nt - 1)
            x0, y0, z0, m0 = xt[i], yt[i], zt[i], mt[i]
            x1, y1, z1 = xt[i1], yt[i1], zt[i1]
            x2, y2, z2 = xt[i2], yt[i2], zt[i2]
            x3, y3, z3 = xt[i3], yt[i3], zt[i3]
            m1 = mt[i1] if i + 1 < nt else zero
            m2 = mt[i2] if i + 2 < nt else zero
            m3 = mt[i3] if i + 3 < nt else zero
            ax0 = ay0 = az0 = ax1 = ay1 = az1 = zero
            ax2 = ay2 = az2 = ax3 = ay3 = az3 = zero
            p0 = p1 = p2 = p3 = zero
            for j in range(c1 - lo):
                xj, yj, zj, mj = cx[j], cy[j], cz[j], cm[j]
                dx0, dy0, dz0 = xj - x0, yj - y0, zj - z0
                dx1, dy1, dz1 = xj - x1, yj - y1, zj - z1
                dx2, dy2, dz2 = xj - x2, yj - y2, zj - z2
                dx3, dy3, dz3 = xj - x3, yj - y3, zj - z3
                r0 = inverse_distance(dx0, dy0, dz0, eps2, zero, one)
                r1 = inverse_distance(dx1, dy1, dz1, eps2, zero, one)
                r2 = inverse_distance(dx2, dy2, dz2, eps2, zero, one)
                r3 = inverse_distance(dx3, dy3, dz3, eps2, zero, one)
                s0, s1, s2, s3 = r0 * r0 * r0, r1 * r1 * r1, r2 * r2 * r2, r3 * r3 * r3
                ax0 += mj * s0 * dx0
                ay0 += mj * s0 * dy0
                az0 += mj * s0 * dz0
                ax1 += mj * s1 * dx1
                ay1 += mj * s1 * dy1
                az1 += mj * s1 * dz1
                ax2 += mj * s2 * dx2
                ay2 += mj * s2 * dy2
                az2 += mj * s2 * dz2
                ax3 += mj * s3 * dx3
                ay3 += mj * s3 * dy3
                az3 += mj * s3 * dz3
                q0, q1, q2, q3 = m0 * s0, m1 * s1, m2 * s2, m3 * s3
                bx[j] -= q0 * dx0 + q1 * dx1 + q2 * dx2 + q3 * dx3
                by[j] -= q0 * dy0 + q1 * dy1 + q2 * dy2 + q3 * dy3
                bz[j] -= q0 * dz0 + q1 * dz1 + q2 * dz2 + q3 * dz3
                if with_potential:
                    p0 -= mj * r0
                    p1 -= mj * r1
                    p2 -= mj * r2
                    p3 -= mj * r3
                    bp[j] -= m0 * r0 + m1 * r1 + m2 * r2 + m3 * r3
            for k, ax, ay, az, p in ((i, ax0, ay0, az0, p0), (i + 1, ax1, ay1, az1, p1),
                                     (i + 2, ax2, ay2, az2, p2), (i + 3, ax3, ay3, az3, p3)):
                if k < nt:
                    out_t[0, k] += ax
                    out_t[1, k] += ay
                    out_t[2, k] += az
                    if with_potential:
                        out_t[3, k] += p
    if self_pairs:  # one array: the reactions, then the pairs within each group of four
        out_t += out_s
        for i in range(0, nt, 4):
            for a in range(i, min(i + 4, nt)):
                for b in range(a + 1, min(i + 4, nt)):
                    dx, dy, dz = xt[b] - xt[a], yt[b] - yt[a], zt[b] - zt[a]
                    r = inverse_distance(dx, dy, dz, eps2, zero, one)
                    s = r * r * r
                    out_t[0, a] += mt[b] * s * dx
                    out_t[1, a] += mt[b] * s * dy
                    out_t[2, a] += mt[b] * s * dz
                    out_t[0, b] -= mt[a] * s * dx
                    out_t[1, b] -= mt[a] * s * dy
                    out_t[2, b] -= mt[a] * s * dz
                    if with_potential:
                        out_t[3, a] -= mt[b] * r
                        out_t[3, b] -= mt[a] * r
    return out_t, out_s


@njit(**_JIT)
def _pair_accel(xt, yt, zt, mt, xs, ys, zs, ms, eps2):
    return _symmetric(xt, yt, zt, mt, xs, ys, zs, ms, eps2, False, False)


@njit(**_JIT)
def _pair_accel_potential(xt, yt, zt, mt, xs, ys, zs, ms, eps2):
    return _symmetric(xt, yt, zt, mt, xs, ys, zs, ms, eps2, True, False)


@njit(**_JIT)
def _self_accel(xt, yt, zt, mt, xs, ys, zs, ms, eps2):
    return _symmetric(xt, yt, zt, mt, xs, ys, zs, ms, eps2, False, True)


@njit(**_JIT)
def _self_accel_potential(xt, yt, zt, mt, xs, ys, zs, ms, eps2):
    return _symmetric(xt, yt, zt, mt, xs, ys, zs, ms, eps2, True, True)


#: (with_potential, self_pairs) -> kernel
_SYMMETRIC = {(False, False): _pair_accel, (True, False): _pair_accel_potential,
              (False, True): _self_accel, (True, True): _self_accel_potential}


def symmetric_pair_forces(target_position, target_mass, source_position, source_mass, eps2,
                          with_potential):
    """Partial forces on both tiles of a pair, each pair evaluated once (Newton's third law).

    The separation, ``1 / r`` and ``1 / r^3`` of each pair serve both bodies: the target gets
    ``+m_j s d`` and the source ``-m_i s d``. Against two calls of :func:`accel_tile` this
    saves the costly part of every interaction for a few more multiply-adds and a load and
    store of the sources' sums (the gain is measured in docs/performance.md). For two distinct
    tiles (the self tile goes through :func:`self_tile_forces`). Targets go four at a time;
    past the end of the tile, lanes repeat the last target with zero mass, so any lengths
    work.

    Parameters
    ----------
    target_position, source_position : ndarray, shape (3, nt) and (3, ns)
    target_mass, source_mass : ndarray, shape (nt,) and (ns,)
    eps2 : float32 or float64
        Squared softening, in the arrays' dtype.
    with_potential : bool
        Add the potential as row 3 of both results.

    Returns
    -------
    on_target, on_source : ndarray, shape (3 or 4, nt) and (3 or 4, ns)
        G = 1, as :func:`tile_pair_forces`.
    """
    kernel = _SYMMETRIC[bool(with_potential), False]
    return kernel(*target_position, target_mass, *source_position, source_mass, eps2)


def self_tile_forces(position, mass, eps2, with_potential):
    """Partial forces (3 or 4, n) of a tile on itself, each pair ``i < j`` evaluated once.

    The self term is never formed, so the potential needs no correction (unlike
    ``tile_pair_forces(..., diagonal=True)``, which it replaces under the symmetric scheme).
    """
    kernel = _SYMMETRIC[bool(with_potential), True]
    return kernel(*position, mass, *position, mass, eps2)[0]
