"""Numba kernels of the tree far field: an octree over bodies in Morton order, its multipoles,
and a group walk that evaluates forces with quadrupole cells and the direct tile kernel.

Pure functions on structure-of-arrays; no Dask. The method (Barnes & Hut 1986 with the
group walks of Barnes 1990, Bonsai and GADGET):

1. **Order.** Bodies are sorted by a 63-bit Morton key (21 bits per axis) in a bounding cube,
   so every octree cell is a contiguous run of bodies (:func:`morton_keys`).
2. **Tree.** :func:`build_tree` splits runs by key bits into at most eight children until a
   run has at most ``leaf_size`` bodies. Cells are stored in depth-first pre-order with a
   ``skip`` index (the cell after the subtree), so a walk needs no stack.
3. **Moments.** :func:`cell_moments` computes each cell's mass, centre of mass, traceless
   quadrupole about it and ``b_max`` (the largest distance of its bodies from the centre of
   mass) directly from its bodies, accumulated in float64.
4. **Walk.** :func:`walk`: each leaf of a target tree is a group that walks a source tree
   (the same tree, or another tile's). One walk per
   group accepts a cell when ``|com - c| - r > b_max / theta`` (``c``, ``r``: the group's
   centre and radius, so the test holds for every target) and evaluates it as a softened
   monopole plus a quadrupole (M2P); leaves that fail it have their bodies gathered into one
   list, evaluated with the direct tile kernel (P2P, :func:`~nbody_dask.kernels.cpu.
   accel_tile`). Every target sums its terms in a fixed order: the result does not depend
   on threads. With ``theta`` small enough that no cell is accepted, the result is the direct
   sum (the same kernel, in another order of sources).
5. **Tiles.** A spatial tile is a run of the Morton curve of all the bodies; its tree is
   built in their cube, so its cells are cells of one octree, and the cells its run cuts are
   never accepted (:func:`acceptable_cells`): walks of every tile pair are as accurate as one
   tree's walk.

The quadrupole term is not softened: accepted cells are far from their targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .cpu import accel_potential_tile, accel_tile
from .law import JIT_OPTIONS as _JIT
from .law import inverse_distance, reciprocal_sqrt

__all__ = ["morton_keys", "build_tree", "cell_moments", "walk_sorted", "TileTree", "build",
           "walk", "refit", "Summary", "summarize", "SUMMARY_BODIES", "Forest", "forest",
           "far_walk_sorted", "far_walk", "FarFieldError", "near_sources",
           "displacement_bound", "check_tree_parameters", "acceptable_cells",
           "tree_accelerations", "KEY_BITS", "THETA", "LEAF_SIZE"]

KEY_BITS = 21  #: bits per axis of a Morton key (63 in all)

#: Default opening angle: with :data:`LEAF_SIZE`, it meets median 3e-4 and 99th percentile
#: 3e-3 relative force error on a Plummer sphere, an exponential disk (the hardest: flat cells)
#: and a merger of 65,536 bodies (measured: benchmarks/tree.py, tests/test_tree.py).
THETA = 0.4
#: Default most bodies per leaf (a target group of the walk). Larger groups make the walk's
#: test stricter for most of their targets and the direct part longer and better vectorised:
#: 64 was faster and more accurate than 16 and 32 at every opening angle measured.
LEAF_SIZE = 64



@njit(**_JIT)
def _spread(v):
    """The 21 low bits of ``v`` moved to every third bit."""
    v &= np.uint64(0x1FFFFF)
    v = (v | (v << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v << np.uint64(2))) & np.uint64(0x1249249249249249)
    return v


@njit(parallel=True, **_JIT)
def morton_keys(x, y, z, lo, size):
    """Morton keys of bodies in the cube ``[lo, lo + size)^3`` (``lo`` of length 3)."""
    n = x.shape[0]
    keys = np.empty(n, dtype=np.uint64)
    scale = float(1 << KEY_BITS) / size
    top = (1 << KEY_BITS) - 1
    for i in prange(n):
        ix = min(max(int((float(x[i]) - lo[0]) * scale), 0), top)
        iy = min(max(int((float(y[i]) - lo[1]) * scale), 0), top)
        iz = min(max(int((float(z[i]) - lo[2]) * scale), 0), top)
        keys[i] = ((_spread(np.uint64(ix)) << np.uint64(2))
                   | (_spread(np.uint64(iy)) << np.uint64(1)) | _spread(np.uint64(iz)))
    return keys


@njit(parallel=True, **_JIT)
def _take(values, order):
    """``values[order]``, in parallel (a gather of a whole tile)."""
    out = np.empty(order.shape[0], dtype=values.dtype)
    for i in prange(order.shape[0]):
        out[i] = values[order[i]]
    return out


@njit(**_JIT)
def build_tree(keys, leaf_size):
    """The octree of bodies sorted by Morton key.

    Returns
    -------
    start, end : ndarray of int64
        Each cell's run of bodies ``[start, end)``.
    skip : ndarray of int64
        The index of the cell after each cell's subtree (pre-order).
    leaf : ndarray of bool
        Whether a cell is a leaf (at most ``leaf_size`` bodies, or no more key bits).
    """
    n = keys.shape[0]
    cap = 2 * (n // max(leaf_size, 1) + 1) * 8 + 1
    start = np.empty(cap, dtype=np.int64)
    end = np.empty(cap, dtype=np.int64)
    parent = np.empty(cap, dtype=np.int64)
    leaf = np.zeros(cap, dtype=np.bool_)
    stack_lo = np.empty(8 * 64, dtype=np.int64)
    stack_hi = np.empty(8 * 64, dtype=np.int64)
    stack_level = np.empty(8 * 64, dtype=np.int64)
    stack_parent = np.empty(8 * 64, dtype=np.int64)
    top = 0
    stack_lo[0], stack_hi[0], stack_level[0], stack_parent[0] = 0, n, 0, -1
    top = 1
    count = 0
    bounds = np.empty(9, dtype=np.int64)
    while top > 0:
        top -= 1
        lo, hi, level, up = stack_lo[top], stack_hi[top], stack_level[top], stack_parent[top]
        if count == cap:  # chains of one-child cells (clustered bodies): grow
            start = np.concatenate((start, np.empty(cap, dtype=np.int64)))
            end = np.concatenate((end, np.empty(cap, dtype=np.int64)))
            parent = np.concatenate((parent, np.empty(cap, dtype=np.int64)))
            leaf = np.concatenate((leaf, np.zeros(cap, dtype=np.bool_)))
            cap *= 2
        cell = count
        count += 1
        start[cell], end[cell], parent[cell] = lo, hi, up
        if hi - lo <= leaf_size or level == KEY_BITS:
            leaf[cell] = True
            continue
        shift = np.uint64(3 * (KEY_BITS - 1 - level))
        # children: runs of equal 3-bit digit at this level (keys are sorted)
        bounds[0] = lo
        k = lo
        for digit in range(8):
            while k < hi and ((keys[k] >> shift) & np.uint64(7)) == np.uint64(digit):
                k += 1
            bounds[digit + 1] = k
        for digit in range(7, -1, -1):  # pushed in reverse: popped (numbered) in order
            if bounds[digit + 1] > bounds[digit]:
                stack_lo[top], stack_hi[top] = bounds[digit], bounds[digit + 1]
                stack_level[top], stack_parent[top] = level + 1, cell
                top += 1
    size = np.ones(count, dtype=np.int64)
    for cell in range(count - 1, 0, -1):  # children come after their parent
        size[parent[cell]] += size[cell]
    skip = np.arange(count, dtype=np.int64) + size
    return start[:count].copy(), end[:count].copy(), skip, leaf[:count].copy()


@njit(parallel=True, **_JIT)
def cell_moments(x, y, z, m, start, end):
    """Mass, centre of mass, traceless quadrupole and b_max of every cell (float64).

    Returns
    -------
    mass : ndarray, shape (c,)
    com : ndarray, shape (3, c)
    quad : ndarray, shape (6, c)
        ``Q_ab = sum m (3 d_a d_b - |d|^2 delta_ab)``, ``d`` the offset from the centre of
        mass, in the order xx, yy, zz, xy, xz, yz.
    bmax : ndarray, shape (c,)
    """
    c = start.shape[0]
    mass = np.zeros(c)
    com = np.zeros((3, c))
    quad = np.zeros((6, c))
    bmax = np.zeros(c)
    for k in prange(c):
        mt = sx = sy = sz = 0.0
        for i in range(start[k], end[k]):
            mi = float(m[i])
            mt += mi
            sx += mi * float(x[i])
            sy += mi * float(y[i])
            sz += mi * float(z[i])
        if mt > 0.0:
            cx, cy, cz = sx / mt, sy / mt, sz / mt
        else:  # massless cell: its geometric centre
            cx = cy = cz = 0.0
            for i in range(start[k], end[k]):
                cx += float(x[i])
                cy += float(y[i])
                cz += float(z[i])
            count = end[k] - start[k]
            cx, cy, cz = cx / count, cy / count, cz / count
        qxx = qyy = qzz = qxy = qxz = qyz = 0.0
        b2 = 0.0
        for i in range(start[k], end[k]):
            dx, dy, dz = float(x[i]) - cx, float(y[i]) - cy, float(z[i]) - cz
            r2 = dx * dx + dy * dy + dz * dz
            mi = float(m[i])
            qxx += mi * (3.0 * dx * dx - r2)
            qyy += mi * (3.0 * dy * dy - r2)
            qzz += mi * (3.0 * dz * dz - r2)
            qxy += mi * 3.0 * dx * dy
            qxz += mi * 3.0 * dx * dz
            qyz += mi * 3.0 * dy * dz
            b2 = max(b2, r2)
        mass[k] = mt
        com[0, k], com[1, k], com[2, k] = cx, cy, cz
        quad[0, k], quad[1, k], quad[2, k] = qxx, qyy, qzz
        quad[3, k], quad[4, k], quad[5, k] = qxy, qxz, qyz
        bmax[k] = np.sqrt(b2)
    return mass, com, quad, bmax


@njit(**_JIT)
def _m2p(xt, yt, zt, cx, cy, cz, cm, qxx, qyy, qzz, qxy, qxz, qyz, eps2, out):
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
def _accepted_m2p(tx, ty, tz, lo, hi, moments, accepted, n_acc, gathered, eps2, part):
    """Add the M2P forces of the cells ``accepted[:n_acc]`` on targets ``lo:hi`` to
    ``part``: their moments (rows of ``moments``) gathered into the contiguous rows of the
    scratch ``gathered`` (10, cells) first, with no allocation."""
    for t in range(n_acc):
        c = accepted[t]
        for r in range(10):
            gathered[r, t] = moments[c, r]
    g = gathered
    _m2p(tx[lo:hi], ty[lo:hi], tz[lo:hi], g[1, :n_acc], g[2, :n_acc], g[3, :n_acc],
         g[0, :n_acc], g[4, :n_acc], g[5, :n_acc], g[6, :n_acc], g[7, :n_acc], g[8, :n_acc],
         g[9, :n_acc], eps2, part)


@njit(**_JIT)
def _group_sphere(tx, ty, tz, lo, hi):
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
_NEVER = np.finfo(np.float64).max


@njit(**_JIT)
def _walk_table(mass, com, bmax, acceptable, inv_theta):
    """What a walk's opening test reads of each cell, side by side (one cache line a cell):
    (cells, 4) float64, the centre of mass and the distance beyond which the cell is
    accepted, ``b_max / theta`` (:func:`_beyond`), or :data:`_NEVER` for a cell without mass
    or not :func:`acceptable <acceptable_cells>`."""
    cells = mass.shape[0]
    table = np.empty((cells, 4))
    for k in range(cells):
        table[k, 0], table[k, 1], table[k, 2] = com[0, k], com[1, k], com[2, k]
        table[k, 3] = bmax[k] * inv_theta if mass[k] != 0.0 and acceptable[k] else _NEVER
    return table


@njit(**_JIT)
def _beyond(table, k, gcx, gcy, gcz, radius):
    """The opening test: whether cell ``k`` of a :func:`_walk_table` is far enough from a
    group of centre ``gc`` and radius ``radius`` for every target of the group,
    ``|com - gc| - radius > b_max / theta``."""
    dx, dy, dz = table[k, 0] - gcx, table[k, 1] - gcy, table[k, 2] - gcz
    return np.sqrt(dx * dx + dy * dy + dz * dz) - radius > table[k, 3]


@njit(**_JIT)
def _group_forces(tx, ty, tz, lo, hi, x, y, z, m, eps2, start, end, skip, leaf, table,
                  moments, own, rows, accepted, opened, buffer, gathered):
    """Forces on the targets ``tx[lo:hi]`` (a leaf of the target tree) by one walk of the
    source tree (``x, y, z, m`` and the tree arrays).

    ``own`` is the source cell that is this very leaf (same tree), or -1: its bodies' self
    terms are left out of the potential. ``table`` is the source cells' :func:`_walk_table`;
    ``moments`` (cells, 10) holds their mass, centre of mass and quadrupole in the run's
    dtype, for the M2P kernel. ``accepted``,
    ``opened`` (int64, one slot per cell), ``buffer`` (shape (4, k)) and ``gathered``
    (shape (10, cells)), both in the run's dtype, are scratch; returns the result
    (``rows``, hi - lo) and the buffer (grown if it was too small).
    """
    cells = start.shape[0]
    gcx, gcy, gcz, radius = _group_sphere(tx, ty, tz, lo, hi)
    n_acc = n_open = n_src = 0
    first = -1  # where the group's own bodies start in the gathered list
    k = 0
    while k < cells:
        if _beyond(table, k, gcx, gcy, gcz, radius):
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
    if rows == 4:
        part = accel_potential_tile(tx[lo:hi], ty[lo:hi], tz[lo:hi], buffer[0, :p],
                                    buffer[1, :p], buffer[2, :p], buffer[3, :p], eps2,
                                    first >= 0, max(first, 0))
    else:
        part = accel_tile(tx[lo:hi], ty[lo:hi], tz[lo:hi], buffer[0, :p], buffer[1, :p],
                          buffer[2, :p], buffer[3, :p], eps2)
    # M2P: the accepted cells' moments, gathered into contiguous rows (no allocation)
    _accepted_m2p(tx, ty, tz, lo, hi, moments, accepted, n_acc, gathered, eps2, part)
    return part, buffer


@njit(parallel=True, **_JIT)
def walk_sorted(tx, ty, tz, tstart, tend, tleaf, x, y, z, m, start, end, skip, leaf, mass,
                com, quad, bmax, acceptable, eps2, theta, with_potential, same, chunks):
    """Forces (G = 1) on the bodies of a target tree by the bodies of a source tree, one group
    walk per target leaf.

    ``tx, ty, tz`` (targets) and ``x, y, z, m`` (sources) are in the run's dtype, each sorted
    by its tree's keys; ``tstart, tend, tleaf`` are the target tree's cells, the other arrays
    the source tree and its moments (:func:`build_tree`, :func:`cell_moments`). ``same``:
    the two trees are one, and self terms are left out of the potential. The target leaves
    are cut into ``chunks`` runs, one parallel iteration each, with its own scratch; every
    target is computed by one thread in a fixed order, so the result is the same for any
    number of threads. Returns shape (3, nt), or (4, nt) with the potential in row 3, in the
    targets' sorted order and the run's dtype.
    """
    nt = tx.shape[0]
    dtype = tx.dtype
    rows = 4 if with_potential else 3
    out = np.zeros((rows, nt), dtype=dtype)
    if nt == 0 or x.shape[0] == 0:
        return out
    cells = start.shape[0]
    groups = np.nonzero(tleaf)[0]
    n_groups = groups.shape[0]
    chunks = max(1, min(chunks, n_groups))
    inv_theta = 1.0 / theta
    # the moments in the run's dtype, for the M2P kernel: mass, centre, quadrupole
    # (one cell's ten values side by side: one cache line to gather an accepted cell)
    moments = _moment_table(mass, com, quad, dtype)
    table = _walk_table(mass, com, bmax, acceptable, inv_theta)
    for chunk in prange(chunks):
        accepted = np.empty(cells, dtype=np.int64)
        opened = np.empty(cells, dtype=np.int64)
        buffer = np.empty((4, 4096), dtype=dtype)
        gathered = np.empty((10, cells), dtype=dtype)
        for g in range(chunk * n_groups // chunks, (chunk + 1) * n_groups // chunks):
            cell = groups[g]
            lo, hi = tstart[cell], tend[cell]
            part, buffer = _group_forces(tx, ty, tz, lo, hi, x, y, z, m, eps2, start, end,
                                         skip, leaf, table, moments, cell if same else -1,
                                         rows, accepted, opened, buffer, gathered)
            out[:, lo:hi] = part
    return out


@njit(**_JIT)
def _moment_table(mass, com, quad, dtype):
    """Cells' mass, centre of mass and quadrupole in ``dtype``, one cell's ten values side by
    side (one cache line to gather an accepted cell for the M2P kernel)."""
    moments = np.empty((mass.shape[0], 10), dtype=dtype)
    moments[:, 0] = mass.astype(dtype)
    moments[:, 1:4] = com.T.astype(dtype)
    moments[:, 4:10] = quad.T.astype(dtype)
    return moments


@njit(parallel=True, **_JIT)
def far_walk_sorted(tx, ty, tz, tstart, tend, tleaf, roots, far, skip, leaf, mass, com, quad,
                    bmax, acceptable, eps2, theta, with_potential, chunks):
    """Forces (G = 1) on the bodies of a target tree by the far source tiles of a forest of
    tree summaries (:class:`Forest`): one walk per target leaf over the summaries of tiles
    ``far`` (in that order), every accepted cell through the M2P kernel.

    ``tx, ty, tz, tstart, tend, tleaf`` are as in :func:`walk_sorted`; the other arrays are
    the forest's. A summary leaf that fails the opening test would need the tile's bodies:
    it adds nothing and is counted. Returns the forces (3 or 4 rows, in the targets' sorted
    order) and that count, which is 0 whenever the tiles ``far`` were classified far
    (:func:`near_sources`) with a margin the bodies kept to.
    """
    nt = tx.shape[0]
    dtype = tx.dtype
    rows = 4 if with_potential else 3
    out = np.zeros((rows, nt), dtype=dtype)
    groups = np.nonzero(tleaf)[0]
    n_groups = groups.shape[0]
    chunks = max(1, min(chunks, n_groups))
    failed = np.zeros(chunks, dtype=np.int64)
    if nt == 0 or far.shape[0] == 0:
        return out, 0
    cells = skip.shape[0]
    inv_theta = 1.0 / theta
    moments = _moment_table(mass, com, quad, dtype)
    table = _walk_table(mass, com, bmax, acceptable, inv_theta)
    for chunk in prange(chunks):
        accepted = np.empty(cells, dtype=np.int64)
        gathered = np.empty((10, cells), dtype=dtype)
        for g in range(chunk * n_groups // chunks, (chunk + 1) * n_groups // chunks):
            cell = groups[g]
            lo, hi = tstart[cell], tend[cell]
            gcx, gcy, gcz, radius = _group_sphere(tx, ty, tz, lo, hi)
            n_acc = 0
            for f in range(far.shape[0]):
                k = roots[far[f]]
                while k < roots[far[f] + 1]:
                    if mass[k] == 0.0:  # adds nothing
                        k = skip[k]
                    elif _beyond(table, k, gcx, gcy, gcz, radius):
                        accepted[n_acc] = k
                        n_acc += 1
                        k = skip[k]
                    elif leaf[k]:
                        failed[chunk] += 1
                        k = skip[k]
                    else:
                        k += 1
            part = np.zeros((rows, hi - lo), dtype=dtype)
            _accepted_m2p(tx, ty, tz, lo, hi, moments, accepted, n_acc, gathered, eps2, part)
            out[:, lo:hi] = part
    return out, failed.sum()


@njit(**_JIT)
def _group_spheres(x, y, z, start, end, leaf):
    """The sphere (:func:`_group_sphere`) of every leaf: shape (4, leaves), centre and
    radius."""
    leaves = np.flatnonzero(leaf)
    out = np.empty((4, leaves.shape[0]))
    for g in range(leaves.shape[0]):
        k = leaves[g]
        out[0, g], out[1, g], out[2, g], out[3, g] = _group_sphere(x, y, z, start[k], end[k])
    return out


@njit(parallel=True, **_JIT)
def _near_pairs(spheres, owner, roots, skip, leaf, mass, com, bmax, acceptable, theta,
                displacement, slack, n_tiles):
    """(n_tiles, n_tiles) bool: [i, j] when a group of tile i (``spheres``, ``owner``) reaches
    a summary leaf of tile j (the forest's other arrays) that fails the opening test grown
    for bodies moving up to ``displacement`` (see :func:`near_sources`)."""
    n_groups = spheres.shape[1]
    near = np.zeros((n_groups, n_tiles), dtype=np.bool_)
    inv_theta = 1.0 / theta
    grow = (1.0 + 2.0 * np.sqrt(3.0)) * displacement + slack
    for g in prange(n_groups):
        gx, gy, gz, radius = spheres[0, g], spheres[1, g], spheres[2, g], spheres[3, g]
        for j in range(n_tiles):
            if j == owner[g]:
                continue
            k = roots[j]
            while k < roots[j + 1]:
                dx, dy, dz = com[0, k] - gx, com[1, k] - gy, com[2, k] - gz
                if mass[k] == 0.0 or (acceptable[k] and
                                      np.sqrt(dx * dx + dy * dy + dz * dz) - radius - grow
                                      > (bmax[k] + 2.0 * displacement) * inv_theta):
                    k = skip[k]
                elif leaf[k]:
                    near[g, j] = True
                    break
                else:
                    k += 1
    out = np.eye(n_tiles, dtype=np.bool_)
    for g in range(n_groups):
        for j in range(n_tiles):
            out[owner[g], j] |= near[g, j]
    return out


@njit(**_JIT)
def _summary_cells(start, end, skip, leaf, max_bodies):
    """The top of a tree: cells down to the first with at most ``max_bodies`` bodies (or a
    leaf), in pre-order. Returns their indices, their skip links among themselves, and which
    of them end the summary (its leaves)."""
    cells = start.shape[0]
    keep = np.empty(cells, dtype=np.int64)
    ends = np.empty(cells, dtype=np.bool_)
    n = 0
    k = 0
    while k < cells:
        keep[n] = k
        ends[n] = leaf[k] or end[k] - start[k] <= max_bodies
        k = skip[k] if ends[n] else k + 1
        n += 1
    keep = keep[:n].copy()
    return keep, np.searchsorted(keep, skip[keep]), ends[:n].copy()


def acceptable_cells(start: np.ndarray, end: np.ndarray, leaf: np.ndarray) -> np.ndarray:
    """Which cells of a tree a walk may accept: all but those holding more than half of its
    bodies (the root and the chain of cells below it that keep most of them), and those
    holding its first or last body in key order, unless they are leaves or hold at most
    :data:`SUMMARY_BODIES` bodies.

    A spatial tile is a run of the Morton curve. Its top cells are often a few pieces far
    apart, and the cells where its run starts and ends are cut by the neighbouring tiles:
    lopsided, their expansions converge slowly for their ``b_max``. Accepting them made 64
    tiles of a Plummer sphere 1.3x less accurate than one tree at the same theta; with the
    tiles' trees in one cube (:func:`build`'s ``cube``) and these cells never accepted, any
    number of tiles is as accurate as one tree. In one tree of all the bodies nearly every
    target lies inside such cells, so they are opened anyway. Small cells stay acceptable,
    so that a summary (:func:`summarize`) can stand for the whole tree.
    """
    n = int(end[0] - start[0]) if start.shape[0] else 0
    edge = ((start == 0) | (end == n)) & ~leaf & (end - start > SUMMARY_BODIES)
    return ((end - start) * 2 <= n) & ~edge


@dataclass(frozen=True)
class TileTree:
    """The octree of a set of bodies, with its moments: what a walk needs of a source or
    target tile (:func:`build`).

    Attributes
    ----------
    order : ndarray of int64, shape (n,)
        The bodies' indices in the input, in tree (Morton) order.
    x, y, z, m : ndarray, shape (n,)
        Positions and masses in tree order, in the input's dtype.
    start, end, skip, leaf : ndarray
        The cells (:func:`build_tree`).
    mass, com, quad, bmax : ndarray
        Their moments (:func:`cell_moments`), float64.
    acceptable : ndarray of bool
        Which cells a walk may accept (:func:`acceptable_cells`).
    """

    order: np.ndarray
    x: np.ndarray
    y: np.ndarray
    z: np.ndarray
    m: np.ndarray
    start: np.ndarray
    end: np.ndarray
    skip: np.ndarray
    leaf: np.ndarray
    mass: np.ndarray
    com: np.ndarray
    quad: np.ndarray
    bmax: np.ndarray
    acceptable: np.ndarray

    @property
    def size(self) -> int:
        return self.m.shape[0]


def check_tree_parameters(theta: float, leaf_size: int) -> None:
    """Raise a ValueError naming ``theta`` or ``leaf_size`` if out of range."""
    if not 0 < theta <= 1:
        raise ValueError(f"theta must be in (0, 1], got {theta!r}")
    if leaf_size < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size!r}")


def build(position: np.ndarray, mass: np.ndarray, leaf_size: int = LEAF_SIZE,
          cube: np.ndarray | None = None) -> TileTree:
    """The octree and moments of bodies ``position`` (3, n) with masses ``mass``.

    Keys are taken in ``cube`` (``[lower corner (3), edge]``, float64, holding every body:
    the cube of all tiles, so that their cells are cells of one octree) or, if None, in the
    bodies' own bounding cube; the bodies are sorted by key (stably, so equal keys keep their
    input order) and the result depends only on the inputs.
    """
    position = np.ascontiguousarray(position)
    dtype = position.dtype
    n = position.shape[1]
    if cube is not None:
        lo, size = np.asarray(cube[:3], dtype=np.float64), float(cube[3])
    elif n == 0:
        lo, size = np.zeros(3), 1.0
    else:
        lo = position.min(axis=1).astype(np.float64)
        size = float((position.max(axis=1).astype(np.float64) - lo).max())
        size = size * (1 + 1e-9) if size > 0 else 1.0
    keys = morton_keys(position[0], position[1], position[2], lo, size)
    order = np.argsort(keys, kind="stable")
    x, y, z = (_take(position[a], order) for a in range(3))
    m = _take(np.ascontiguousarray(mass, dtype=dtype), order)
    if n == 0:
        start = end = skip = np.zeros(0, dtype=np.int64)
        leaf = np.zeros(0, dtype=np.bool_)
    else:
        start, end, skip, leaf = build_tree(_take(keys, order), leaf_size)
    cmass, com, quad, bmax = cell_moments(x, y, z, m, start, end)
    return TileTree(order, x, y, z, m, start, end, skip, leaf, cmass, com, quad, bmax,
                    acceptable_cells(start, end, leaf))


def walk(target: TileTree, source: TileTree, eps2: Any, theta: float = THETA,
         with_potential: bool = False, same: bool = False) -> np.ndarray:
    """Forces (G = 1) on the bodies of ``target`` by those of ``source``, in the target's
    input order: shape (3, n) or, ``with_potential``, (4, n) with the potential in row 3.

    ``eps2`` is the squared softening in the bodies' dtype; ``same`` says ``source`` is
    ``target`` (the self terms are then left out of the potential). Runs on the calling
    thread's Numba threads (``numba.set_num_threads``); the result does not depend on them.
    """
    sorted_out = walk_sorted(target.x, target.y, target.z, target.start, target.end,
                             target.leaf, source.x, source.y, source.z, source.m,
                             source.start, source.end, source.skip, source.leaf, source.mass,
                             source.com, source.quad, source.bmax, source.acceptable, eps2,
                             float(theta), bool(with_potential), bool(same),
                             8 * numba.get_num_threads())
    out = np.empty_like(sorted_out)
    out[:, target.order] = sorted_out
    return out


def refit(tree: TileTree, position: np.ndarray, mass: np.ndarray) -> TileTree:
    """The tree of the same bodies at new positions, with the cells of ``tree``.

    The bodies keep their order and cells (the topology is not rebuilt), so between two
    re-tilings every cell holds the same bodies and its centre and size move no faster than
    they do; only the moments are recomputed. ``position`` and ``mass`` are in the input
    order of :func:`build`.
    """
    position = np.ascontiguousarray(position)
    x, y, z = (_take(position[a], tree.order) for a in range(3))
    m = _take(np.ascontiguousarray(mass, dtype=position.dtype), tree.order)
    cmass, com, quad, bmax = cell_moments(x, y, z, m, tree.start, tree.end)
    return TileTree(tree.order, x, y, z, m, tree.start, tree.end, tree.skip, tree.leaf,
                    cmass, com, quad, bmax, tree.acceptable)


@dataclass(frozen=True)
class Summary:
    """The top cells of a tile's tree, with their moments, and the tile's reach: what every
    other tile needs of it to be evaluated from afar (:func:`summarize`).

    Attributes
    ----------
    skip, leaf : ndarray
        The cells' skip links among themselves (pre-order) and whether a cell ends the
        summary (a leaf of the tree, or a cell of at most ``max_bodies`` bodies).
    mass, com, quad, bmax, acceptable : ndarray
        Their moments, float64, and whether a walk may accept them, as in :class:`TileTree`.
    groups : ndarray, shape (4, leaves)
        The spheres (centre, radius; float64) of the tile's target groups, its tree's
        leaves: what the walk's opening test sees of them.
    """

    skip: np.ndarray
    leaf: np.ndarray
    mass: np.ndarray
    com: np.ndarray
    quad: np.ndarray
    bmax: np.ndarray
    acceptable: np.ndarray
    groups: np.ndarray


#: Cells of at most this many bodies end a tile's :class:`Summary`. On a Plummer sphere of
#: 1,048,576 bodies in 256 tiles the forest of summaries takes about 5 bytes per body and 22%
#: of the tile pairs are near at theta = 0.4 (31% with 512, for a quarter of the cells).
SUMMARY_BODIES = 128


def summarize(tree: TileTree, max_bodies: int = SUMMARY_BODIES) -> Summary:
    """The :class:`Summary` of a tile's tree: its cells down to ``max_bodies`` bodies."""
    keep, skip, leaf = _summary_cells(tree.start, tree.end, tree.skip, tree.leaf, max_bodies)
    return Summary(skip, leaf, tree.mass[keep], tree.com[:, keep], tree.quad[:, keep],
                   tree.bmax[keep], tree.acceptable[keep],
                   _group_spheres(tree.x, tree.y, tree.z, tree.start, tree.end, tree.leaf))


@dataclass(frozen=True)
class Forest:
    """The summaries of all tiles, concatenated in tile order (:func:`forest`): tile ``j``'s
    cells are ``roots[j]:roots[j + 1]``, with the :class:`Summary` fields; ``groups`` are
    all tiles' group spheres, ``owner`` their tiles."""

    roots: np.ndarray
    skip: np.ndarray
    leaf: np.ndarray
    mass: np.ndarray
    com: np.ndarray
    quad: np.ndarray
    bmax: np.ndarray
    acceptable: np.ndarray
    groups: np.ndarray
    owner: np.ndarray

    @property
    def n_tiles(self) -> int:
        return self.roots.shape[0] - 1


def forest(*summaries: Summary) -> Forest:
    """The :class:`Forest` of the tiles' summaries, in the given order."""
    sizes = [s.mass.shape[0] for s in summaries]
    roots = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    owner = [np.full(s.groups.shape[1], j, dtype=np.int64) for j, s in enumerate(summaries)]
    skip = [s.skip + r for s, r in zip(summaries, roots[:-1], strict=True)]
    return Forest(roots, np.concatenate(skip),
                  np.concatenate([s.leaf for s in summaries]),
                  np.concatenate([s.mass for s in summaries]),
                  np.concatenate([s.com for s in summaries], axis=1),
                  np.concatenate([s.quad for s in summaries], axis=1),
                  np.concatenate([s.bmax for s in summaries]),
                  np.concatenate([s.acceptable for s in summaries]),
                  np.concatenate([s.groups for s in summaries], axis=1),
                  np.concatenate(owner))


class FarFieldError(RuntimeError):
    """Bodies moved farther between two re-tilings than the margin their tiles were
    classified near or far with: a far tile would need its bodies. ``step``: the step whose
    forces found it, when known."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step

    def __reduce__(self):  # raised on a worker, re-raised in the driver with its step
        return type(self), (self.args[0], self.step)


def far_walk(target: TileTree, trees: Forest, far: np.ndarray, eps2: Any,
             theta: float = THETA, with_potential: bool = False) -> np.ndarray:
    """Forces (G = 1) on the bodies of ``target`` by the tiles ``far`` of a forest, from
    their summaries only, in the target's input order: shape (3, n) or (4, n).

    Every accepted cell is the one a :func:`walk` of that tile's whole tree accepts, so the
    result is the sum of those walks (to rounding) as long as no summary leaf fails the
    opening test.

    Raises
    ------
    FarFieldError
        If a summary leaf fails the opening test for some target group.
    """
    far = np.asarray(far, dtype=np.int64)
    sorted_out, failed = far_walk_sorted(
        target.x, target.y, target.z, target.start, target.end, target.leaf, trees.roots, far,
        trees.skip, trees.leaf, trees.mass, trees.com, trees.quad, trees.bmax,
        trees.acceptable, eps2, float(theta), bool(with_potential), 8 * numba.get_num_threads())
    if failed:
        raise FarFieldError(
            f"{failed} target group(s) came too close to cells of far tiles {far.tolist()}: the "
            "bodies moved farther between re-tilings than the near/far margin allowed")
    out = np.empty_like(sorted_out)
    out[:, target.order] = sorted_out
    return out


def near_sources(trees: Forest, theta: float, displacement: float = 0.0) -> list[list[int]]:
    """For each target tile, the source tiles that may be near it, in order: every tile
    itself, and those with a summary leaf that one of the target's groups could reach while
    no body moves farther than ``displacement`` from where it is now. The others are far:
    they can be evaluated from their summaries (:func:`far_walk`).

    Each group walks each other tile's summary as the force walk would, with its test made
    stricter by the motion: a cell of centre ``c`` is accepted for a group (centre ``g``,
    radius ``r``) when ``|c - g| - r - (1 + 2 sqrt 3) d > (b_max + 2 d) / theta``. A cell's
    centre moves by at most ``d``, a group's centre by ``sqrt 3 d``, b_max grows by at most
    ``2 d`` and ``r`` by ``sqrt 3 d``, so such a cell passes the walk's own test at every
    step until the bodies have moved farther than ``d``.
    """
    t = trees.n_tiles
    scale = float(np.abs(trees.com).max()) if trees.com.size else 0.0
    near = _near_pairs(trees.groups, trees.owner, trees.roots, trees.skip, trees.leaf,
                       trees.mass, trees.com, trees.bmax, trees.acceptable, float(theta),
                       float(displacement),
                       1e-9 * scale, t)  # the slack covers rounding in the walk's test
    return [np.flatnonzero(row).tolist() for row in near]


def displacement_bound(speed: float, acceleration: float, duration: float) -> float:
    """A bound on how far a body moves in ``duration`` from its largest speed and
    acceleration now, with a safety factor 2 for the acceleration growing on the way."""
    return 2.0 * (speed * duration + acceleration * duration * duration)


def tree_accelerations(position, mass, softening=0.0, theta=THETA, leaf_size=LEAF_SIZE):
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
