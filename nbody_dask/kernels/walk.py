"""The tree walk: forces on a target tree's bodies by a source tree (no Dask).

Each leaf of a target tree is a group that walks a source tree (the same tree, or another
tile's) once (the group walks of Barnes 1990, Bonsai and GADGET): it accepts a cell when
``|com - c| - r > b_max / theta`` (``c``, ``r``: the group's centre and radius, so the test
holds for every target of the group) and evaluates it as a softened monopole plus a
quadrupole (M2P, :func:`m2p`); leaves that fail the test have their bodies gathered into one
list, evaluated with the direct tile kernel (P2P, :func:`~nbody_dask.kernels.cpu.
accel_tile`). Every target sums its terms in a fixed order: the result does not depend on
threads. With ``theta`` small enough that no cell is accepted, the result is the direct sum
(the same kernel, in another order of sources). The quadrupole term is not softened:
accepted cells are far from their targets.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .cpu import accel_potential_tile, accel_rate_tile, accel_tile
from .law import JIT_OPTIONS as _JIT
from .law import inverse_distance, reciprocal_sqrt
from .octree import TileTree, build

__all__ = ["m2p", "accepted_m2p", "group_sphere", "NEVER", "walk_table",
           "beyond", "moment_table", "walk_sorted", "walk", "check_tree_parameters",
           "tree_accelerations"]



@njit(**_JIT)
def m2p(xt, yt, zt, cx, cy, cz, cm, qxx, qyy, qzz, qxy, qxz, qyz, eps2, out):
    """Add the accelerations (and, with 4 rows in ``out``, the potentials) of cells as a
    softened monopole plus a quadrupole to ``out`` (3 or 4, nt)."""
    nt = xt.shape[0]
    nc = cx.shape[0]
    with_potential = out.shape[0] == 4
    one = np.ones(1, dtype=xt.dtype)[0]
    zero = one - one
    half = one / (one + one)
    half5 = (one + one + one + one + one) * half
    for i in range(nt):
        xi, yi, zi = xt[i], yt[i], zt[i]
        ax = ay = az = phi = zero
        for j in range(nc):
            dx, dy, dz = xi - cx[j], yi - cy[j], zi - cz[j]  # from the cell to the target
            inv_s = inverse_distance(dx, dy, dz, eps2, zero, one)  # the softened monopole
            # the quadrupole's plain 1 / r (r > 0: the cell was accepted, so it is far)
            inv = reciprocal_sqrt(dx * dx + dy * dy + dz * dz, one)
            inv2 = inv * inv
            inv5 = inv2 * inv2 * inv
            qx = qxx[j] * dx + qxy[j] * dy + qxz[j] * dz
            qy = qxy[j] * dx + qyy[j] * dy + qyz[j] * dz
            qz = qxz[j] * dx + qyz[j] * dy + qzz[j] * dz
            rqr = dx * qx + dy * qy + dz * qz
            mono = cm[j] * inv_s * inv_s * inv_s
            radial = half5 * rqr * inv5 * inv2 + mono
            ax += qx * inv5 - radial * dx
            ay += qy * inv5 - radial * dy
            az += qz * inv5 - radial * dz
            phi -= cm[j] * inv_s + half * rqr * inv5
        out[0, i] += ax
        out[1, i] += ay
        out[2, i] += az
        if with_potential:
            out[3, i] += phi


@njit(**_JIT)
def accepted_m2p(tx, ty, tz, lo, hi, moments, accepted, n_acc, gathered, eps2, part):
    """Add the M2P forces of the cells ``accepted[:n_acc]`` on targets ``lo:hi`` to
    ``part``: their moments (rows of ``moments``) gathered into the contiguous rows of the
    scratch ``gathered`` (10, cells) first, with no allocation."""
    for t in range(n_acc):
        c = accepted[t]
        for r in range(10):
            gathered[r, t] = moments[c, r]
    g = gathered
    m2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], g[1, :n_acc], g[2, :n_acc], g[3, :n_acc],
         g[0, :n_acc], g[4, :n_acc], g[5, :n_acc], g[6, :n_acc], g[7, :n_acc], g[8, :n_acc],
         g[9, :n_acc], eps2, part)


@njit(**_JIT)
def group_sphere(tx, ty, tz, lo, hi):
    """The centre of the bounding box of targets ``lo:hi`` and its half diagonal (float64):
    a sphere holding every target of the group."""
    gx0 = gx1 = float(tx[lo])
    gy0 = gy1 = float(ty[lo])
    gz0 = gz1 = float(tz[lo])
    for i in range(lo + 1, hi):
        gx0, gx1 = min(gx0, float(tx[i])), max(gx1, float(tx[i]))
        gy0, gy1 = min(gy0, float(ty[i])), max(gy1, float(ty[i]))
        gz0, gz1 = min(gz0, float(tz[i])), max(gz1, float(tz[i]))
    radius = 0.5 * np.sqrt((gx1 - gx0) ** 2 + (gy1 - gy0) ** 2 + (gz1 - gz0) ** 2)
    return 0.5 * (gx0 + gx1), 0.5 * (gy0 + gy1), 0.5 * (gz0 + gz1), radius


#: The opening distance of a cell a walk never accepts (finite: the kernels assume no inf).
NEVER = np.finfo(np.float64).max


@njit(**_JIT)
def walk_table(mass, com, bmax, acceptable, inv_theta):
    """What a walk's opening test reads of each cell, side by side (one cache line a cell):
    (cells, 4) float64, the centre of mass and the distance beyond which the cell is
    accepted, ``b_max / theta`` (:func:`beyond`), or :data:`NEVER` for a cell without mass
    or not :func:`acceptable <acceptable_cells>`."""
    cells = mass.shape[0]
    table = np.empty((cells, 4))
    for k in range(cells):
        table[k, 0], table[k, 1], table[k, 2] = com[0, k], com[1, k], com[2, k]
        table[k, 3] = bmax[k] * inv_theta if mass[k] != 0.0 and acceptable[k] else NEVER
    return table


@njit(**_JIT)
def beyond(table, k, gcx, gcy, gcz, radius):
    """The opening test: whether cell ``k`` of a :func:`walk_table` is far enough from a
    group of centre ``gc`` and radius ``radius`` for every target of the group,
    ``|com - gc| - radius > b_max / theta``."""
    dx, dy, dz = table[k, 0] - gcx, table[k, 1] - gcy, table[k, 2] - gcz
    return np.sqrt(dx * dx + dy * dy + dz * dz) - radius > table[k, 3]


@njit(**_JIT)
def moment_table(mass, com, quad, dtype):
    """Cells' mass, centre of mass and quadrupole in ``dtype``, one cell's ten values side by
    side (one cache line to gather an accepted cell for the M2P kernel)."""
    moments = np.empty((mass.shape[0], 10), dtype=dtype)
    moments[:, 0] = mass.astype(dtype)
    moments[:, 1:4] = com.T.astype(dtype)
    moments[:, 4:10] = quad.T.astype(dtype)
    return moments


@njit(**_JIT)
def _group_forces(gx, gy, gz, gm, sphere, sources, eps2, table, moments, own, rows,
                  scratch, buffer, rate):
    """Forces on a group of targets (positions ``gx, gy, gz``, masses ``gm``: a leaf of the
    target tree, or its active bodies) by one walk of the source tree (``sources``:
    :attr:`TileTree.sources`) for the group's ``sphere`` (:func:`group_sphere` of the
    whole leaf).

    ``own`` is the source cell that is this very leaf, whole (same tree), or -1: its bodies'
    self terms are left out of the potential. ``table`` is the source cells'
    :func:`walk_table`; ``moments`` (cells, 10) holds their mass, centre of mass and
    quadrupole in the run's dtype, for the M2P kernel. ``scratch`` is ``(accepted, opened,
    gathered)``: int64 slots for the accepted and the opened cells and a (10, cells) array in
    the run's dtype; ``buffer`` (4, k) too. With ``rate`` a last row holds the sum of the
    squared pairwise rates of the bodies the walk sums directly (P2P,
    :func:`~nbody_dask.kernels.cpu.accel_rate_tile`); accepted cells add nothing to it.
    Returns the result (``rows`` (+ 1), targets) and the buffer (grown if it was too small).
    Each target's terms do not depend on the group's other targets.
    """
    x, y, z, m, start, end, skip, leaf = sources[:8]
    accepted, opened, gathered = scratch
    cells = start.shape[0]
    nt = gx.shape[0]
    gcx, gcy, gcz, radius = sphere
    n_acc = n_open = n_src = 0
    first = -1  # where the group's own bodies start in the gathered list
    k = 0
    while k < cells:
        if beyond(table, k, gcx, gcy, gcz, radius):
            accepted[n_acc] = k
            n_acc += 1
            k = skip[k]
        elif leaf[k]:
            if k == own:
                first = n_src
            opened[n_open] = k
            n_open += 1
            n_src += end[k] - start[k]
            k = skip[k]
        else:
            k += 1
    # P2P: the opened leaves' bodies in one list, through the direct kernel
    if buffer.shape[1] < n_src:
        buffer = np.empty((4, max(n_src, 2 * buffer.shape[1])), dtype=buffer.dtype)
    p = 0
    for t in range(n_open):
        c = opened[t]
        for i in range(start[c], end[c]):
            buffer[0, p], buffer[1, p], buffer[2, p], buffer[3, p] = x[i], y[i], z[i], m[i]
            p += 1
    if rate:
        mine = np.full(nt, -1, dtype=np.int64)
        if first >= 0:
            for i in range(nt):
                mine[i] = first + i
        part = accel_rate_tile(gx, gy, gz, gm, mine, buffer[0, :p], buffer[1, :p],
                               buffer[2, :p], buffer[3, :p], eps2, rows == 4)
    elif rows == 4:
        part = accel_potential_tile(gx, gy, gz, buffer[0, :p], buffer[1, :p],
                                    buffer[2, :p], buffer[3, :p], eps2, first >= 0,
                                    max(first, 0))
    else:
        part = accel_tile(gx, gy, gz, buffer[0, :p], buffer[1, :p], buffer[2, :p],
                          buffer[3, :p], eps2)
    # M2P: the accepted cells' moments, gathered into contiguous rows (no allocation)
    accepted_m2p(gx, gy, gz, 0, nt, moments, accepted, n_acc, gathered, eps2, part[:rows])
    return part, buffer


@njit(parallel=True, **_JIT)
def walk_sorted(targets, sources, eps2, theta, with_potential, same, chunks,
                target_mass=None, rate=False, active=None):
    """Forces (G = 1) on the bodies of a target tree by the bodies of a source tree, one group
    walk per target leaf.

    ``targets`` is :attr:`TileTree.targets` of the target tree, ``sources``
    :attr:`TileTree.sources` of the source tree: positions and masses in the run's dtype,
    each sorted by its tree's keys, the cells and the source's moments
    (:func:`~nbody_dask.kernels.octree.build_tree`, :func:`~nbody_dask.kernels.octree.
    cell_moments`). ``same``: the two trees are one, and self terms are left out of the
    potential. The target leaves
    are cut into ``chunks`` runs, one parallel iteration each, with its own scratch; every
    target is computed by one thread in a fixed order, so the result is the same for any
    number of threads. Returns shape (3, nt), or (4, nt) with the potential in row 3, in the
    targets' sorted order and the run's dtype; with ``rate`` a last row holds the pairs'
    rates of the directly summed sources (:func:`_group_forces`; ``target_mass``: the
    target tree's masses, :attr:`TileTree.m`). With ``active`` (bool, the targets' sorted
    order) only the active targets are computed (the other columns stay zero), each exactly
    as without it: a group with no active body does not walk, a group with some walks for
    them alone; not with ``with_potential``.
    """
    tx, ty, tz, tstart, tend, tleaf = targets
    mass, com, quad, bmax, acceptable = sources[8:]
    nt = tx.shape[0]
    dtype = tx.dtype
    rows = 4 if with_potential else 3
    out = np.zeros((rows + 1 if rate else rows, nt), dtype=dtype)
    masses = tx if target_mass is None else target_mass  # (read only with ``rate``)
    if nt == 0 or sources[0].shape[0] == 0:
        return out
    cells = mass.shape[0]
    groups = np.nonzero(tleaf)[0]
    if active is not None:
        if not with_potential:  # the groups with an active body, shared out evenly
            keep = np.zeros(groups.shape[0], dtype=np.bool_)
            for g in range(groups.shape[0]):
                keep[g] = active[tstart[groups[g]]:tend[groups[g]]].any()
            groups = groups[keep]
    n_groups = groups.shape[0]
    chunks = max(1, min(chunks, n_groups))
    inv_theta = 1.0 / theta
    # the moments in the run's dtype, for the M2P kernel: mass, centre, quadrupole
    # (one cell's ten values side by side: one cache line to gather an accepted cell)
    moments = moment_table(mass, com, quad, dtype)
    table = walk_table(mass, com, bmax, acceptable, inv_theta)
    for chunk in prange(chunks):
        scratch = (np.empty(cells, dtype=np.int64), np.empty(cells, dtype=np.int64),
                   np.empty((10, cells), dtype=dtype))
        buffer = np.empty((4, 4096), dtype=dtype)
        for g in range(chunk * n_groups // chunks, (chunk + 1) * n_groups // chunks):
            cell = groups[g]
            lo, hi = tstart[cell], tend[cell]
            sphere = group_sphere(tx, ty, tz, lo, hi)
            count = hi - lo  # the group's targets to compute: all, or (active) some
            if active is not None:
                if not with_potential:
                    count = np.count_nonzero(active[lo:hi])
            if count == hi - lo:
                part, buffer = _group_forces(tx[lo:hi], ty[lo:hi], tz[lo:hi],
                                             masses[lo:hi], sphere, sources, eps2, table,
                                             moments, cell if same else -1, rows, scratch,
                                             buffer, rate)
                out[:, lo:hi] = part
            elif active is not None:  # some of the group active (none: left out above)
                picked = np.flatnonzero(active[lo:hi]) + lo
                part, buffer = _group_forces(tx[picked], ty[picked], tz[picked],
                                             masses[picked], sphere, sources, eps2, table,
                                             moments, -1, rows, scratch, buffer, rate)
                for r in range(part.shape[0]):
                    for t in range(count):
                        out[r, picked[t]] = part[r, t]
    return out


def walk(target: TileTree, source: TileTree, eps2: Any, theta: float,
         with_potential: bool = False, same: bool = False, rate: bool = False,
         active: np.ndarray | None = None) -> np.ndarray:
    """Forces (G = 1) on the bodies of ``target`` by those of ``source``, in the target's
    input order: shape (3, n) or, ``with_potential``, (4, n) with the potential in row 3;
    with ``rate`` a last row holds the sum of the squared pairwise rates of the pairs the
    walk sums directly (individual time steps' pairwise criterion; the accepted cells'
    pairs, at least ``b_max / theta`` away, add terms falling as ``r^-6`` and are left out).

    ``eps2`` is the squared softening in the bodies' dtype; ``same`` says ``source`` is
    ``target`` (the self terms are then left out of the potential). ``active`` (bool, the
    target's input order; not with ``with_potential``) computes those targets alone, each
    exactly as without it, and leaves the others' columns zero. Runs on the calling
    thread's Numba threads (``numba.set_num_threads``); the result does not depend on them.
    """
    flags = None if active is None else np.ascontiguousarray(active[target.order])
    sorted_out = walk_sorted(target.targets, source.sources, eps2, float(theta),
                             bool(with_potential), bool(same), 8 * numba.get_num_threads(),
                             target.m, bool(rate), flags)
    out = np.empty_like(sorted_out)
    out[:, target.order] = sorted_out
    return out


def check_tree_parameters(theta: float, leaf_size: int) -> None:
    """Raise a ValueError naming ``theta`` or ``leaf_size`` if out of range."""
    if not 0 < theta <= 1:
        raise ValueError(f"theta must be in (0, 1], got {theta!r}")
    if leaf_size < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size!r}")


def tree_accelerations(position: np.ndarray, mass: np.ndarray, softening: float, theta: float,
                       leaf_size: int) -> np.ndarray:
    """Accelerations (G = 1) of a body set by the tree, in the inputs' dtype.

    Parameters
    ----------
    position : ndarray, shape (3, n)
        Positions, float32 or float64 (structure of arrays, as in a tile).
    mass : ndarray, shape (n,)
    softening : float
        Plummer softening length.
    theta : float
        Opening angle (0 < theta <= 1); smaller is more accurate and slower.
    leaf_size : int
        Most bodies in a leaf (a target group).

    Raises
    ------
    ValueError
        If ``theta`` is not in (0, 1] or ``leaf_size`` < 1.

    Returns
    -------
    ndarray, shape (3, n)
        In the order of ``position``.
    """
    check_tree_parameters(theta, leaf_size)
    tree = build(position, mass, leaf_size)
    dtype = tree.x.dtype.type
    return walk(tree, tree, dtype(softening) * dtype(softening), theta, same=True)
