"""The short-range force of TreePM: a periodic group walk with a cutoff (no Dask).

The short-range part of gravity (:func:`~nbody_dask.kernels.law.short_range`, scale
``r_s``) falls off as ``exp(-r^2 / 4 r_s^2)``; beyond ``cutoff`` it is dropped. Each group
of a target tree (:mod:`~nbody_dask.kernels.octree`; :func:`target_groups`: cells of up to
:data:`GROUP_TARGETS` bodies) walks a source tree once, as a leaf of the isolated walk
(:mod:`~nbody_dask.kernels.walk`) does, with three changes:

* distances are minimum images in the periodic cube of side ``box`` (``cutoff < box / 2``,
  so at most one image of a body is within reach);
* a cell whose every body is beyond the cutoff from every target of the group
  (``|c - g| - radius - b_max > cutoff``, ``c`` the cell's centre of mass and ``g`` the
  group's centre, as minimum images) is skipped with its subtree;
* an accepted cell (the opening test of the isolated walk, and ``|c - g| + radius + b_max
  <= box / 2`` so that the image of the cell is the nearest image of each of its bodies)
  contributes its monopole and quadrupole with the short-range law: for a radial potential
  ``psi(r)`` the quadrupole term is ``D(r) (d.Q.d) / 2`` with ``D = (psi'' - psi'/r) / 3r^2``,
  here ``D = g / r^5 + h / r^2``, ``h = exp(-r^2/4 r_s^2) / (6 sqrt(pi) r_s^3)``, and
  since that law's Laplacian (``3 h``) is not zero, the trace ``T`` of the cell's second
  moment adds ``T h / 2`` (:func:`cell_spread`).

Only cells of more than 8 bodies are accepted (fewer cost about as much pair by pair), by
the isolated walk's opening test, ``|c - g| - radius > b_max / theta``, and only where the
Gaussian factor varies little across them: the short-range law falls off on the scale
``r_s``, and expanded about the centre of mass it converges with ``kappa = b_max (|c - g| +
radius) / 2 r_s^2``, not ``b_max / |d|``; cells need ``kappa <=`` :data:`KAPPA`.

A cell within the cutoff of every target of the group and small next to ``r_s`` (``b_max
<=`` :data:`INSIDE` ``r_s``: the dense cores of clustered boxes) is taken another way: its
short range is Newton's (its subtree walked as the isolated walk walks it: cells by the
opening test as Newton's multipoles, leaves pair by pair with Newton's law by the direct
tile kernel) less its long range, which varies on the scale ``r_s`` and so is one
expansion about its centre of mass (:func:`long_m2p`). Its pairs need neither the
cutoff nor the split.

Opened leaves' bodies are gathered at their image nearest the group (one shift for a leaf
whose bodies all share it) and summed pair by pair (P2P), those within the cutoff only:
for every :data:`PICK` targets the sources within the cutoff of their bounding sphere are
picked leaf by leaf (:func:`_pick`), then four targets at a time sweep them. Coincident
bodies (``r = 0``) contribute nothing to each other. Every target sums its terms in a fixed
order: the result does not depend on threads.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .law import JIT_OPTIONS as _JIT
from .law import (POLYNOMIAL_CUTOFF, POLYNOMIAL_DEGREE, fast_short_range, inverse_distance,
                  long_range_polynomials, polynomial_long_range, short_range_constants)
from .octree import TileTree
from .stack import align_stack
from .cpu import accel_potential_tile, accel_tile
from .walk import group_sphere, m2p

__all__ = ["GROUP_TARGETS", "INSIDE", "KAPPA", "LAW_POLYNOMIALS", "LAW_SPLIT", "PICK",
           "cell_spread", "long_m2p", "short_m2p", "short_p2p", "short_pairs",
           "short_walk", "short_walk_sorted", "spread_of", "target_groups", "walk_constants"]


#: The largest ``kappa`` of an accepted cell (module docstring). Measured on 262,144 bodies
#: at theta 0.4 (short-range error against the exact sum over the total force, 1,000
#: targets): a uniform box has a median of 3.9e-6 and a p99 of 3.1e-5 at 2, 1.5e-4 p99 at 3,
#: 4.2e-4 median without the bound; 20 Plummer spheres 1.1e-4 median at 2 in 1.0 s. The
#: bound kappa^3 g(r) <= theta^3 (g the short-range factor) gave 6.7e-5 there in 1.66 s,
#: where theta 0.3 with this one gives 5.2e-5 in 1.3 s.
KAPPA = 2.0

#: The largest ``b_max`` of a cell, in units of ``r_s``, whose short range is taken as
#: Newton's less one expansion of its long range (:func:`long_m2p`) where the whole cell is
#: within the cutoff of every target of a group: the long range varies on the scale
#: ``r_s``, so the expansion's error is of order ``(b_max / r_s)^3`` of it. Measured on 20
#: Plummer spheres of 262,144 bodies (theta 0.4, the error of the short-range force against
#: the walk without it): 0.5 took the walk from 1.09 to 0.95 s with a median of 6.7e-6 and
#: a p99 of 1.5e-4; 0.7: 0.87 s, 7.3e-5 and 2.8e-4; 1.0: 0.86 s, 1.1e-4 and 3.4e-4, and a
#: p99 of 2.6e-3 in a uniform box (no change there at 0.5).
INSIDE = 0.5

#: Targets that share one pick of sources (:func:`_pick`), evaluated four at a time: a
#: larger group picks more sources beyond the cutoff of each target, a smaller one picks
#: more often. 16 measured fastest on uniform and clustered boxes of 262,144 bodies
#: (8: 1.03x / 1.05x, 4: 1.14x / 1.15x the time; groups of a leaf then).
PICK = 16


@njit(**_JIT)
def _nearest(d, box, inv_box, half):
    """``d`` minus the multiple of ``box`` that brings it into ``[-box/2, box/2)``."""
    return d - box * np.floor(d * inv_box + half)


@njit(**_JIT)
def short_p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out):
    """Add the short-range forces of sources (nearest images) within the cutoff on targets
    to ``out`` (3 or 4, nt). ``law`` is the walk's constants in the run's dtype
    (:func:`walk_constants`). The cutoff applies to each pair, so the pairs a walk evaluates
    body by body act on each other equally and oppositely. The inner loop has no branch and
    no call: it vectorises."""
    align_stack()
    if out.shape[0] == 4:
        if law[LAW_POLYNOMIALS] > 0:
            _p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out, True, True)
        else:
            _p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out, True, False)
    elif law[LAW_POLYNOMIALS] > 0:
        _p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out, False, True)
    else:
        _p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out, False, False)


@njit(inline="always", **_JIT)
def _p2p(tx, ty, tz, xs, ys, zs, ms, eps2, law, out, with_potential, polynomial):
    """:func:`short_p2p` with ``with_potential`` and ``polynomial`` constants of the
    caller, so that each of its four copies computes only what it needs."""
    box, inv_box = law[0], law[1]
    cut2 = law[2] * law[2]
    split, poly = law[LAW_SPLIT:LAW_POLYNOMIALS], law[LAW_POLYNOMIALS:]
    one = np.ones(1, dtype=tx.dtype)[0]
    zero = one - one
    half = one / (one + one)
    for i in range(tx.shape[0]):
        xi, yi, zi = tx[i], ty[i], tz[i]
        ax = ay = az = psi = zero
        for j in range(xs.shape[0]):
            dx = _nearest(xs[j] - xi, box, inv_box, half)
            dy = _nearest(ys[j] - yi, box, inv_box, half)
            dz = _nearest(zs[j] - zi, box, inv_box, half)
            f, e = _pair(dx, dy, dz, ms[j], eps2, cut2, split, poly, zero, one,
                         with_potential, polynomial)
            ax += f * dx
            ay += f * dy
            az += f * dz
            psi += e
        _keep(out, i, ax, ay, az, psi, with_potential)


@njit(inline="always", **_JIT)
def _pair(dx, dy, dz, m, eps2, cut2, split, poly, zero, one, with_potential, polynomial):
    """One source's short-range terms on one target at separation ``d`` (the image to use):
    the force factor and the potential term (zero without ``with_potential``), zero beyond
    the cutoff or at ``r = 0``. With ``polynomial``, Newton's softened law less the
    long-range part of :func:`~nbody_dask.kernels.law.polynomial_long_range` (``poly``; no
    square root), else Newton's times the factors of
    :func:`~nbody_dask.kernels.law.fast_short_range` (``split``)."""
    r2 = dx * dx + dy * dy + dz * dz
    mass = m if (r2 > zero) & (r2 <= cut2) else zero
    # (the law before the inverse distance: called first, that kept this loop scalar)
    if polynomial:
        lf, le = polynomial_long_range(r2, poly, one)
    else:
        g, e, _ = fast_short_range(np.sqrt(r2), split, one)
    inv = inverse_distance(dx, dy, dz, eps2, zero, one)
    if polynomial:
        return mass * (inv * inv * inv - lf), (mass * (inv - le) if with_potential else zero)
    return mass * g * inv * inv * inv, (mass * e * inv if with_potential else zero)


@njit(**_JIT)
def _pick(tx, ty, tz, lo, hi, sources, leaves, n_leaves, reach, kept):
    """Copy into ``kept`` (4, ns) the sources within ``reach`` of the bounding sphere of
    targets ``lo:hi`` (:func:`~nbody_dask.kernels.walk.group_sphere`), leaf by leaf in
    their order; return how many. ``sources`` (4, ns) are the gathered bodies, ``leaves``
    (n, 6) their leaves: first and last index into ``sources``, and the sphere that holds
    the leaf's bodies (centre, radius; float64). A leaf wholly inside the reach is copied
    without a test, one wholly outside skipped; only the bodies of a leaf across its edge
    are tested one by one."""
    gx, gy, gz, radius = group_sphere(tx, ty, tz, lo, hi)
    # a margin of 1/1024: no source within the cutoff of a target is left out by rounding
    limit = (float(reach) + radius) * (1.0 + 1.0 / 1024)
    limit2 = limit * limit
    count = 0
    for leaf in range(n_leaves):
        first, last = int(leaves[leaf, 0]), int(leaves[leaf, 1])
        dx, dy, dz = leaves[leaf, 2] - gx, leaves[leaf, 3] - gy, leaves[leaf, 4] - gz
        dist = np.sqrt(dx * dx + dy * dy + dz * dz)
        size = leaves[leaf, 5]
        if dist - size > limit:
            continue
        if dist + size <= limit:
            for j in range(first, last):
                kept[0, count + j - first] = sources[0, j]
                kept[1, count + j - first] = sources[1, j]
                kept[2, count + j - first] = sources[2, j]
                kept[3, count + j - first] = sources[3, j]
            count += last - first
            continue
        for j in range(first, last):
            dx = float(sources[0, j]) - gx
            dy = float(sources[1, j]) - gy
            dz = float(sources[2, j]) - gz
            # written every time, kept by the count: no branch to mispredict
            kept[0, count], kept[1, count] = sources[0, j], sources[1, j]
            kept[2, count], kept[3, count] = sources[2, j], sources[3, j]
            count += dx * dx + dy * dy + dz * dz <= limit2
    return count


@njit(**_JIT)
def short_pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept):
    """:func:`short_p2p` for sources (4, ns) already moved to the image to use for every
    target (no minimum image per pair), four targets at a time: the sources within the
    cutoff of every :data:`PICK` targets are picked first (:func:`_pick`; ``leaves`` as
    there, ``kept`` a (4, ns) scratch array), then each is loaded once for four (as
    :func:`~nbody_dask.kernels.cpu.accel_tile`). The sources left out contribute exactly
    zero. A last group of fewer than four repeats its last target (computed, not kept)."""
    align_stack()
    if out.shape[0] == 4:
        if law[LAW_POLYNOMIALS] > 0:
            _pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept, True, True)
        else:
            _pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept, True, False)
    elif law[LAW_POLYNOMIALS] > 0:
        _pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept, False, True)
    else:
        _pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept, False, False)


@njit(inline="always", **_JIT)
def _pairs(tx, ty, tz, sources, leaves, n_leaves, eps2, law, out, kept, with_potential,
           polynomial):
    """:func:`short_pairs` with ``with_potential`` and ``polynomial`` constants of the
    caller (as :func:`_p2p`)."""
    cut2 = law[2] * law[2]
    split, poly = law[LAW_SPLIT:LAW_POLYNOMIALS], law[LAW_POLYNOMIALS:]
    one = np.ones(1, dtype=tx.dtype)[0]
    zero = one - one
    nt = tx.shape[0]
    last = nt - 1
    for i in range(0, nt, 4):
        if i % PICK == 0:  # PICK is a multiple of four
            ns = _pick(tx, ty, tz, i, min(i + PICK, nt), sources, leaves, n_leaves, law[2],
                       kept)
        i1, i2, i3 = min(i + 1, last), min(i + 2, last), min(i + 3, last)
        x0, y0, z0 = tx[i], ty[i], tz[i]
        x1, y1, z1 = tx[i1], ty[i1], tz[i1]
        x2, y2, z2 = tx[i2], ty[i2], tz[i2]
        x3, y3, z3 = tx[i3], ty[i3], tz[i3]
        ax0 = ay0 = az0 = p0 = ax1 = ay1 = az1 = p1 = zero
        ax2 = ay2 = az2 = p2 = ax3 = ay3 = az3 = p3 = zero
        for j in range(ns):
            xj, yj, zj, mj = kept[0, j], kept[1, j], kept[2, j], kept[3, j]
            dx, dy, dz = xj - x0, yj - y0, zj - z0
            f, e = _pair(dx, dy, dz, mj, eps2, cut2, split, poly, zero, one, with_potential,
                         polynomial)
            ax0 += f * dx
            ay0 += f * dy
            az0 += f * dz
            p0 += e
            dx, dy, dz = xj - x1, yj - y1, zj - z1
            f, e = _pair(dx, dy, dz, mj, eps2, cut2, split, poly, zero, one, with_potential,
                         polynomial)
            ax1 += f * dx
            ay1 += f * dy
            az1 += f * dz
            p1 += e
            dx, dy, dz = xj - x2, yj - y2, zj - z2
            f, e = _pair(dx, dy, dz, mj, eps2, cut2, split, poly, zero, one, with_potential,
                         polynomial)
            ax2 += f * dx
            ay2 += f * dy
            az2 += f * dz
            p2 += e
            dx, dy, dz = xj - x3, yj - y3, zj - z3
            f, e = _pair(dx, dy, dz, mj, eps2, cut2, split, poly, zero, one, with_potential,
                         polynomial)
            ax3 += f * dx
            ay3 += f * dy
            az3 += f * dz
            p3 += e
        _keep(out, i, ax0, ay0, az0, p0, with_potential)
        if i + 1 < nt:
            _keep(out, i1, ax1, ay1, az1, p1, with_potential)
        if i + 2 < nt:
            _keep(out, i2, ax2, ay2, az2, p2, with_potential)
        if i + 3 < nt:
            _keep(out, i3, ax3, ay3, az3, p3, with_potential)


@njit(inline="always", **_JIT)
def _keep(out, i, ax, ay, az, psi, with_potential):
    """Add one target's sums to ``out``."""
    out[0, i] += ax
    out[1, i] += ay
    out[2, i] += az
    if with_potential:
        out[3, i] -= psi


@njit(parallel=True, **_JIT)
def cell_spread(x, y, z, m, start, end, com):
    """Each cell's ``sum m |d|^2`` about its centre of mass (float64): the trace of the
    second moment, which the traceless quadrupole leaves out and the short-range law, whose
    Laplacian is not zero, needs."""
    out = np.zeros(start.shape[0])
    for k in prange(start.shape[0]):
        total = 0.0
        for i in range(start[k], end[k]):
            dx = float(x[i]) - com[0, k]
            dy = float(y[i]) - com[1, k]
            dz = float(z[i]) - com[2, k]
            total += float(m[i]) * (dx * dx + dy * dy + dz * dz)
        out[k] = total
    return out


#: The fast-math freedoms of :func:`short_m2p`: those of every kernel but approximate
#: reciprocals and functions (``arcp``, ``afn``). With them, a walk on a clustered box gave
#: other last bits in a process that compiled it than in one that loaded it from Numba's
#: cache (tests/test_tree.py); exact division and square root cost nothing measurable here.
_M2P_FAST_MATH = set(_JIT["fastmath"]) - {"arcp", "afn"}


@njit(**dict(_JIT, fastmath=_M2P_FAST_MATH))
def short_m2p(tx, ty, tz, moments, count, eps2, law, out):
    """Add the short-range forces of ``count`` cells (columns of ``moments``: mass, centre of
    mass as the image to use, quadrupole xx, yy, zz, xy, xz, yz, and the trace of the second
    moment, :func:`cell_spread`) on targets to ``out``.

    With ``T`` that trace, ``sum m psi(|x - c - d|)`` to second order in ``d`` adds
    ``T laplacian(psi) / 6 = T h / 2`` to the quadrupole term (the Laplacian of the
    short-range potential is ``3 h``)."""
    align_stack()
    rs, split = law[3], law[LAW_SPLIT:LAW_POLYNOMIALS]
    c2sp = split[1]
    one = np.ones(1, dtype=tx.dtype)[0]
    zero = one - one
    half = one / (one + one)
    five = one + one + one + one + one
    six = five + one
    # h = exp(-u^2) / (6 sqrt(pi) r_s^3) = exp(-u^2) * (2 / sqrt(pi)) / (12 r_s^3)
    h0 = c2sp / (six + six) / (rs * rs * rs)
    half_inv_rs2 = half / (rs * rs)
    quarter_inv_rs2 = half * half_inv_rs2
    with_potential = out.shape[0] == 4
    for i in range(tx.shape[0]):
        xi, yi, zi = tx[i], ty[i], tz[i]
        ax = ay = az = psi = zero
        for c in range(count):
            m = moments[0, c]
            dx, dy, dz = xi - moments[1, c], yi - moments[2, c], zi - moments[3, c]
            r2 = dx * dx + dy * dy + dz * dz
            r = np.sqrt(r2)
            g, e, gauss = fast_short_range(r, split, one)
            h = h0 * gauss
            inv_s = inverse_distance(dx, dy, dz, eps2, zero, one)
            inv2 = one / r2
            qxx, qyy, qzz = moments[4, c], moments[5, c], moments[6, c]
            qxy, qxz, qyz = moments[7, c], moments[8, c], moments[9, c]
            qx = qxx * dx + qxy * dy + qxz * dz
            qy = qxy * dx + qyy * dy + qyz * dz
            qz = qxz * dx + qyz * dy + qzz * dz
            rqr = dx * qx + dy * qy + dz * qz
            d_r = g * inv2 * inv2 / r + h * inv2
            d_prime = -(five * g * inv2 * inv2 * inv2 / r + five * h * inv2 * inv2
                        + h * half_inv_rs2 * inv2)
            spread = moments[10, c]
            radial = (m * g * inv_s * inv_s * inv_s - half * d_prime * rqr
                      + spread * h * quarter_inv_rs2)
            ax += d_r * qx - radial * dx
            ay += d_r * qy - radial * dy
            az += d_r * qz - radial * dz
            psi += m * e * inv_s + half * d_r * rqr + half * spread * h
        out[0, i] += ax
        out[1, i] += ay
        out[2, i] += az
        if with_potential:
            out[3, i] -= psi


@njit(**dict(_JIT, fastmath=_M2P_FAST_MATH))
def long_m2p(tx, ty, tz, moments, count, law, out):
    """Subtract the long-range forces of ``count`` cells (columns of ``moments`` as
    :func:`short_m2p` reads them), each within the cutoff of every target, from ``out``:
    with Newton's pairs and the isolated walk's M2P for their bodies, their short
    range. ``law`` is :func:`walk_constants` (the polynomials of
    :func:`~nbody_dask.kernels.law.long_range_polynomials`).

    The long-range potential ``Phi = sum m P(|x - x_j|^2)``, ``P(u) = erf(sqrt(u) / 2r_s)
    / sqrt(u)``, is smooth everywhere (a target may be inside the cell); to second order
    about the centre of mass, with ``d`` from it to the target, ``u = |d|^2``, ``T`` the
    trace of the second moment and ``Q`` the traceless quadrupole (``3 dd - |d|^2``):
    ``Phi = M P + T P' + 2 P'' (d.Q.d + T u) / 3``, and with ``lf = -2 P'`` (the pairs'
    long-range force term) the acceleration ``-d (M lf + 5 T lf' / 3 + 2 lf'' (d.Q.d + T
    u) / 3) - 2 lf' Q.d / 3``. The truncation is of order ``(b_max / r_s)^3`` of it: cells
    need ``b_max <=`` :data:`INSIDE` ``r_s``."""
    align_stack()
    poly = law[LAW_POLYNOMIALS:]
    scale = poly[0]
    one = np.ones(1, dtype=tx.dtype)[0]
    zero = one - one
    two = one + one
    three = two + one
    half = one / two
    third = one / three
    five_thirds = (three + two) * third
    two_thirds = two * third
    with_potential = out.shape[0] == 4
    for i in range(tx.shape[0]):
        xi, yi, zi = tx[i], ty[i], tz[i]
        ax = ay = az = phi = zero
        for c in range(count):
            m = moments[0, c]
            dx, dy, dz = xi - moments[1, c], yi - moments[2, c], zi - moments[3, c]
            u = dx * dx + dy * dy + dz * dz
            x = u * scale - one
            x = x if x < one else one
            # lf and its first two derivatives in x, by Horner's rule
            lf = poly[POLYNOMIAL_DEGREE + 1]
            d1 = d2 = zero
            for k in range(POLYNOMIAL_DEGREE, 0, -1):
                d2 = d2 * x + d1
                d1 = d1 * x + lf
                lf = lf * x + poly[k]
            lf1 = d1 * scale
            lf2 = two * d2 * scale * scale
            qxx, qyy, qzz = moments[4, c], moments[5, c], moments[6, c]
            qxy, qxz, qyz = moments[7, c], moments[8, c], moments[9, c]
            qx = qxx * dx + qxy * dy + qxz * dz
            qy = qxy * dx + qyy * dy + qyz * dz
            qz = qxz * dx + qyz * dy + qzz * dz
            spread = moments[10, c]
            second = dx * qx + dy * qy + dz * qz + spread * u
            radial = m * lf + five_thirds * spread * lf1 + two_thirds * lf2 * second
            ax += radial * dx + two_thirds * lf1 * qx
            ay += radial * dy + two_thirds * lf1 * qy
            az += radial * dz + two_thirds * lf1 * qz
            if with_potential:
                le = poly[2 * POLYNOMIAL_DEGREE + 2]
                for k in range(2 * POLYNOMIAL_DEGREE + 1, POLYNOMIAL_DEGREE + 1, -1):
                    le = le * x + poly[k]
                phi += m * le - half * spread * lf - third * lf1 * second
        out[0, i] += ax
        out[1, i] += ay
        out[2, i] += az
        if with_potential:
            out[3, i] += phi


@njit(**_JIT)
def _group_forces(targets, lo, hi, sources, spread, eps2, theta, law, cells64, moments,
                  leaves, buffer, rows, same):
    """Short-range forces on targets ``lo:hi`` (a group of the target tree) by one walk of
    the source tree (:attr:`TileTree.sources`); ``cells64`` is (box, cutoff, r_s) in float64,
    ``spread`` the source cells' :func:`cell_spread`, ``moments`` (3, 11, cells) in the
    run's dtype for the moments as seen from the group (the nearest image of the centre of
    mass) of the accepted cells, of the cells taken as Newton's multipoles and of the cells
    whose long range is subtracted, ``leaves`` (cells, 6) float64 for the opened leaves
    (their range in the buffer and the sphere holding their bodies, as :func:`_pick` reads
    them), ``buffer`` (3, 4, k) for their bodies, for the bodies picked from them and for
    the bodies summed by Newton's law (grown if too small).

    A cell within the cutoff of every target whose ``b_max`` is at most :data:`INSIDE`
    ``r_s`` is taken as Newton's (its subtree walked as the isolated walk does: cells by
    its opening test, leaves pair by pair by the direct tile kernel) less its long range
    as one expansion (:func:`long_m2p`): no pick, no cutoff, and Newton's cheaper law for its
    pairs. The expansion holds each target's own body where ``same`` (the trees are one):
    its term, ``m le(0)`` in the potential, is taken out again."""
    align_stack()
    tx, ty, tz = targets[0], targets[1], targets[2]
    x, y, z, m, start, end, skip, leaf = sources[:8]
    mass, com, bmax, acceptable = sources[8], sources[9], sources[11], sources[12]
    quad = sources[10]
    box, cutoff = cells64[0], cells64[1]
    n_cells = start.shape[0]
    gcx, gcy, gcz, radius = group_sphere(tx, ty, tz, lo, hi)
    n_acc = n_src = n_leaves = n_newton = n_cells_newton = n_long = 0
    inv_box = 1.0 / box
    half_box = 0.5 * box
    # sources moved to their image nearest the group's centre are the images within the
    # cutoff of every target when radius + cutoff < box / 2 (else: per pair, short_p2p)
    shifted = radius + cutoff < half_box
    side, inv_side = law[0], law[1]
    half = side / (side + side)
    zero = side - side
    gx, gy, gz = tx.dtype.type(gcx), tx.dtype.type(gcy), tx.dtype.type(gcz)
    inv_theta = 1.0 / theta
    inv_2rs2 = 0.5 / (cells64[2] * cells64[2])
    inside = INSIDE * cells64[2]
    own = np.zeros(hi - lo if rows == 4 and same else 0, dtype=tx.dtype)
    k = 0
    while k < n_cells:
        dx = _nearest(com[0, k] - gcx, box, inv_box, 0.5)
        dy = _nearest(com[1, k] - gcy, box, inv_box, 0.5)
        dz = _nearest(com[2, k] - gcz, box, inv_box, 0.5)
        dist = np.sqrt(dx * dx + dy * dy + dz * dz)
        if dist - radius - bmax[k] > cutoff:
            k = skip[k]
        elif (end[k] - start[k] > 8 and acceptable[k]
              and dist - radius > bmax[k] * inv_theta and dist + radius + bmax[k] <= half_box
              and bmax[k] * (dist + radius) * inv_2rs2 <= KAPPA):
            _keep_moments(moments[0], n_acc, mass, quad, spread, k, gcx + dx, gcy + dy,
                          gcz + dz)
            n_acc += 1
            k = skip[k]
        elif (shifted and end[k] - start[k] > 8 and bmax[k] <= inside
              and dist + radius + bmax[k] <= cutoff):
            # Newton's less the long range: every body's image is the centre's shifted
            _keep_moments(moments[2], n_long, mass, quad, spread, k, gcx + dx, gcy + dy,
                          gcz + dz)
            n_long += 1
            if own.shape[0]:  # the group's own bodies in the cell (the same tree)
                for i in range(max(start[k], lo), min(end[k], hi)):
                    own[i - lo] += m[i]
            sx = side * tx.dtype.type(np.floor((com[0, k] - gcx) * inv_box + 0.5))
            sy = side * tx.dtype.type(np.floor((com[1, k] - gcy) * inv_box + 0.5))
            sz = side * tx.dtype.type(np.floor((com[2, k] - gcz) * inv_box + 0.5))
            j = k
            while j < skip[k]:
                cx, cy, cz = com[0, j] - sx, com[1, j] - sy, com[2, j] - sz
                reach = np.sqrt((cx - gcx) ** 2 + (cy - gcy) ** 2 + (cz - gcz) ** 2)
                if acceptable[j] and reach - radius > bmax[j] * inv_theta:
                    _keep_moments(moments[1], n_cells_newton, mass, quad, spread, j, cx, cy,
                                  cz)
                    n_cells_newton += 1
                    j = skip[j]
                elif leaf[j]:
                    count = end[j] - start[j]
                    if n_newton + count > buffer.shape[2]:
                        buffer = _grown(buffer, n_src, n_newton + count, n_newton)
                    newton = buffer[2]
                    for i in range(start[j], end[j]):
                        newton[0, n_newton], newton[1, n_newton] = x[i] - sx, y[i] - sy
                        newton[2, n_newton], newton[3, n_newton] = z[i] - sz, m[i]
                        n_newton += 1
                    j = skip[j]
                else:
                    j += 1
            k = skip[k]
        elif leaf[k]:
            count = end[k] - start[k]
            if n_src + count > buffer.shape[2]:
                buffer = _grown(buffer, n_src, n_src + count, n_newton)
            gathered = buffer[0]
            leaves[n_leaves, 0], leaves[n_leaves, 1] = n_src, n_src + count
            leaves[n_leaves, 2], leaves[n_leaves, 3] = gcx + dx, gcy + dy
            leaves[n_leaves, 4], leaves[n_leaves, 5] = gcz + dz, bmax[k]
            n_leaves += 1
            if not shifted or max(abs(dx), abs(dy), abs(dz)) + bmax[k] < 0.4 * box:
                # one shift for the leaf: none, or the image of its first body, which every
                # body of the leaf shares (the same floor)
                i = start[k]
                sx = side * np.floor((x[i] - gx) * inv_side + half) if shifted else zero
                sy = side * np.floor((y[i] - gy) * inv_side + half) if shifted else zero
                sz = side * np.floor((z[i] - gz) * inv_side + half) if shifted else zero
                for i in range(start[k], end[k]):
                    gathered[0, n_src], gathered[1, n_src] = x[i] - sx, y[i] - sy
                    gathered[2, n_src], gathered[3, n_src] = z[i] - sz, m[i]
                    n_src += 1
            else:  # each body's image nearest the group's centre; no sphere holds them
                leaves[n_leaves - 1, 5] = 4.0 * box
                for i in range(start[k], end[k]):
                    gathered[0, n_src] = x[i] - side * np.floor((x[i] - gx) * inv_side + half)
                    gathered[1, n_src] = y[i] - side * np.floor((y[i] - gy) * inv_side + half)
                    gathered[2, n_src] = z[i] - side * np.floor((z[i] - gz) * inv_side + half)
                    gathered[3, n_src] = m[i]
                    n_src += 1
            k = skip[k]
        else:
            k += 1
    part = np.zeros((rows, hi - lo), dtype=tx.dtype)
    gathered = buffer[0]
    if shifted:  # sources picked per PICK targets
        short_pairs(tx[lo:hi], ty[lo:hi], tz[lo:hi], gathered, leaves, n_leaves, eps2, law,
                    part, buffer[1])
    else:
        short_p2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], gathered[0, :n_src], gathered[1, :n_src],
                  gathered[2, :n_src], gathered[3, :n_src], eps2, law, part)
    short_m2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], moments[0], n_acc, eps2, law, part)
    if n_long:
        newton = buffer[2]
        if rows == 4:
            pairs = accel_potential_tile(tx[lo:hi], ty[lo:hi], tz[lo:hi], newton[0, :n_newton],
                                         newton[1, :n_newton], newton[2, :n_newton],
                                         newton[3, :n_newton], eps2, False, 0)
        else:
            pairs = accel_tile(tx[lo:hi], ty[lo:hi], tz[lo:hi], newton[0, :n_newton],
                               newton[1, :n_newton], newton[2, :n_newton],
                               newton[3, :n_newton], eps2)
        part += pairs
        cells = moments[1]
        m2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], cells[1, :n_cells_newton],
            cells[2, :n_cells_newton], cells[3, :n_cells_newton], cells[0, :n_cells_newton],
            cells[4, :n_cells_newton], cells[5, :n_cells_newton], cells[6, :n_cells_newton],
            cells[7, :n_cells_newton], cells[8, :n_cells_newton], cells[9, :n_cells_newton],
            eps2, part)
        long_m2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], moments[2], n_long, law, part)
        if own.shape[0]:  # each target's own term: Newton's softened and the long range's
            one = side / side
            _, self_term = polynomial_long_range(zero, law[LAW_POLYNOMIALS:], one)
            newton_self = one / np.sqrt(eps2) if eps2 > zero else zero
            for t in range(hi - lo):
                part[3, t] += own[t] * (newton_self - self_term)
    return part, buffer


@njit(inline="always", **_JIT)
def _keep_moments(moments, c, mass, quad, spread, k, cx, cy, cz):
    """Column ``c`` of ``moments`` (11, cells): cell ``k``'s mass, centre (``cx, cy, cz``,
    the image to use), quadrupole and spread."""
    moments[0, c] = mass[k]
    moments[1, c] = cx
    moments[2, c] = cy
    moments[3, c] = cz
    for r in range(6):
        moments[4 + r, c] = quad[r, k]
    moments[10, c] = spread[k]


@njit(**_JIT)
def _grown(buffer, n_src, need, n_newton=0):
    """A larger copy of a walk's ``buffer`` (3, 4, k) holding at least ``need`` bodies a
    slot, with the first ``n_src`` of slot 0 and ``n_newton`` of slot 2."""
    grown = np.empty((3, 4, max(2 * need, 2 * buffer.shape[2])), dtype=buffer.dtype)
    grown[0, :, :n_src] = buffer[0, :, :n_src]
    grown[2, :, :n_newton] = buffer[2, :, :n_newton]
    return grown


@njit(parallel=True, **_JIT)
def short_walk_sorted(targets, groups, sources, spread, eps2, theta, law, cells64,
                      with_potential, chunks, same=False):
    """Short-range forces (G = 1) on the bodies of a target tree by the bodies of a source
    tree, one periodic group walk per target cell of ``groups`` (:func:`target_groups`; see
    the module docstring); in the targets' sorted order, shape (3, nt) or (4, nt). ``same``:
    the two trees are one (:func:`_group_forces`)."""
    tx, tstart, tend = targets[0], targets[3], targets[4]
    nt = tx.shape[0]
    dtype = tx.dtype
    rows = 4 if with_potential else 3
    out = np.zeros((rows, nt), dtype=dtype)
    if nt == 0 or sources[0].shape[0] == 0:
        return out
    n_cells = sources[4].shape[0]
    n_groups = groups.shape[0]
    chunks = max(1, min(chunks, n_groups))
    for chunk in prange(chunks):
        moments = np.empty((3, 11, n_cells), dtype=dtype)
        leaves = np.empty((n_cells, 6))
        buffer = np.empty((3, 4, 4096), dtype=dtype)
        for g in range(chunk * n_groups // chunks, (chunk + 1) * n_groups // chunks):
            cell = groups[g]
            lo, hi = tstart[cell], tend[cell]
            part, buffer = _group_forces(targets, lo, hi, sources, spread, eps2, theta, law,
                                         cells64, moments, leaves, buffer, rows, same)
            out[:, lo:hi] = part
    return out


#: The most targets that walk the source tree together: the largest cells of the target
#: tree with at most this many bodies (or leaves) are the groups. A walk and its gather
#: cost about as much for 128 targets as for a leaf's dozen, and the sources are picked
#: again for every :data:`PICK` of them; measured fastest of 16, 32, 64, 128 and 256.
GROUP_TARGETS = 128


@njit(**_JIT)
def target_groups(start, end, skip, leaf, most):
    """The cells of a tree (depth first, ``skip`` past each subtree) that walk as one
    group: each leaf or cell of at most ``most`` bodies whose parent has more. They hold
    every body once."""
    groups = np.empty(start.shape[0], dtype=np.int64)
    count = k = 0
    while k < start.shape[0]:
        if leaf[k] or end[k] - start[k] <= most:
            groups[count] = k
            count += 1
            k = skip[k]
        else:
            k += 1
    return groups[:count]


def spread_of(tree: TileTree) -> np.ndarray:
    """The :func:`cell_spread` of every cell of ``tree``."""
    return cell_spread(tree.x, tree.y, tree.z, tree.m, tree.start, tree.end, tree.com)


@njit(**_JIT)
def _active_groups(groups, start, end, active_sorted):
    """The groups (:func:`target_groups`) holding an active body (``active_sorted``, in the
    tree's order)."""
    keep = np.zeros(groups.shape[0], dtype=np.bool_)
    for g in range(groups.shape[0]):
        for i in range(start[groups[g]], end[groups[g]]):
            if active_sorted[i]:
                keep[g] = True
                break
    return groups[keep]


#: Where the parts of :func:`walk_constants` begin.
LAW_SPLIT = 4
LAW_POLYNOMIALS = LAW_SPLIT + short_range_constants(1.0, np.float64).shape[0]


def walk_constants(box: float, split: float, cutoff: float, dtype) -> np.ndarray:
    """What the walk's kernels read as ``law``, in ``dtype``: ``(box, 1 / box, cutoff,
    r_s)``, then (from :data:`LAW_SPLIT`) the
    :func:`~nbody_dask.kernels.law.short_range_constants` of the cells' law, then (from
    :data:`LAW_POLYNOMIALS`) the pairs' :func:`~nbody_dask.kernels.law.short_range_polynomials`
    where the cutoff is at most :data:`~nbody_dask.kernels.law.POLYNOMIAL_CUTOFF` ``r_s``
    (zeros beyond: the pairs then take the cells' law)."""
    if cutoff <= POLYNOMIAL_CUTOFF * split:
        poly = long_range_polynomials(split, cutoff, dtype)
    else:
        poly = np.zeros(2 * POLYNOMIAL_DEGREE + 3, dtype=dtype)
    return np.concatenate([np.array([box, 1.0 / box, cutoff, split], dtype=dtype),
                           short_range_constants(split, dtype), poly])


def _same(target: TileTree, source: TileTree) -> bool:
    """Whether two trees are one: the same object, or the same bodies in the same order (a
    copy; distinct bodies at the same places would be coincident, contributing nothing to
    each other either way)."""
    return target is source or (target.x.shape == source.x.shape
                                and all(np.array_equal(a, b) for a, b in
                                        ((target.x, source.x), (target.y, source.y),
                                         (target.z, source.z))))


def short_walk(target: TileTree, source: TileTree, eps2: Any, theta: float, box: float,
               split: float, cutoff: float, with_potential: bool = False,
               spread: np.ndarray | None = None, active: np.ndarray | None = None
               ) -> np.ndarray:
    """Short-range forces (G = 1) on the bodies of ``target`` by those of ``source`` in a
    periodic cube of side ``box``, in the target's input order: shape (3, n) or, with
    ``with_potential``, (4, n).

    ``split`` is ``r_s`` and ``cutoff`` the distance beyond which the short-range force is
    dropped (``< box / 2``), both in length units; ``eps2`` the squared softening in the
    bodies' dtype; ``spread`` the source's :func:`spread_of` (computed here when None).
    With ``active`` (a mask of the target's bodies, in its input order) only the groups
    holding an active body walk: the forces of every body of those groups are exactly the
    full walk's, those of the other bodies are left zero.
    The trees' cells may hold bodies on both sides of the box (after a drift
    across it): such cells have a large ``b_max`` and are opened, never wrong.
    """
    dtype = target.x.dtype.type
    law = walk_constants(box, split, cutoff, dtype)
    cells64 = np.array([box, cutoff, split])
    spread = spread_of(source) if spread is None else spread
    groups = target_groups(target.start, target.end, target.skip, target.leaf, GROUP_TARGETS)
    if active is not None:
        groups = _active_groups(groups, target.start, target.end,
                                np.ascontiguousarray(active[target.order]))
    sorted_out = short_walk_sorted(target.targets, groups, source.sources, spread, eps2,
                                   float(theta), law, cells64, bool(with_potential),
                                   8 * numba.get_num_threads(), _same(target, source))
    out = np.empty_like(sorted_out)
    out[:, target.order] = sorted_out
    return out
