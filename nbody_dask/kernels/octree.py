"""The octree of a tile: Morton keys, cells, moments (no Dask).

Bodies are sorted by a 63-bit Morton key (21 bits per axis) in a bounding cube, so every
octree cell is a contiguous run of bodies (:func:`morton_keys`). :func:`build_tree` splits
runs by key bits into at most eight children until a run has at most ``leaf_size`` bodies;
cells are stored in depth-first pre-order with a ``skip`` index (the cell after the
subtree), so a walk needs no stack. :func:`cell_moments` computes each cell's mass, centre
of mass, traceless quadrupole about it and ``b_max`` (the largest distance of its bodies
from the centre of mass) directly from its bodies, accumulated in float64.
:func:`build` puts it together into a :class:`TileTree`; :func:`refit` follows the bodies
with the same cells. The walks are in :mod:`nbody_dask.kernels.walk`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from .law import JIT_OPTIONS as _JIT

__all__ = ["KEY_BITS", "SUMMARY_BODIES", "OUTLIER_SPAN", "CUBE_SAMPLE", "CUBE_TAIL",
           "central_box", "cube_around",
           "morton_keys", "take", "build_tree", "cell_moments", "acceptable_cells",
           "key_cube", "TileTree", "build", "refit"]

KEY_BITS = 21  #: bits per axis of a Morton key (63 in all)

#: Cells of at most this many bodies end a tile's summary (:mod:`~nbody_dask.kernels.
#: farfield`): small enough that most tile pairs can be far, large enough that the forest of
#: summaries stays a few bytes per body (docs/performance.md).
SUMMARY_BODIES = 128


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
def take(values, order):
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

    @property
    def targets(self) -> tuple:
        """What a walk reads of a target tree: ``(x, y, z, start, end, leaf)``."""
        return self.x, self.y, self.z, self.start, self.end, self.leaf

    @property
    def sources(self) -> tuple:
        """What a walk reads of a source tree: ``(x, y, z, m, start, end, skip, leaf, mass,
        com, quad, bmax, acceptable)``."""
        return (self.x, self.y, self.z, self.m, self.start, self.end, self.skip, self.leaf,
                self.mass, self.com, self.quad, self.bmax, self.acceptable)


#: A bounding cube more than this many times wider than the central bodies' box (a quantile
#: box of a sample) means far outliers: with 21 bits per axis, a body at 1e9 beside a sphere
#: of radius 1 would put the whole sphere in one leaf and make the walk a direct sum.
OUTLIER_SPAN = 1024.0
#: Bodies sampled (evenly, by index) for the central box, and the share of them cut off on
#: each side of each axis.
CUBE_SAMPLE, CUBE_TAIL = 4096, 0.002


def key_cube(position: np.ndarray) -> tuple[np.ndarray, float]:
    """The cube (lower corner, edge; float64) that a tile's own keys are taken in.

    Normally the bodies' bounding cube. When that is more than :data:`OUTLIER_SPAN` times
    wider than the box of the central bodies (axis quantiles ``CUBE_TAIL`` and ``1 -
    CUBE_TAIL`` of a strided sample of :data:`CUBE_SAMPLE`), a cube of four times that box
    around its centre instead: the outliers' keys are clamped to its faces
    (:func:`morton_keys`), so they share the border cells, whose moments (centre of mass,
    ``b_max``) still come from their true positions. The walk stays exact in its test; the
    sphere gets the cells it needs (issue 33, item 15)."""
    low, high = central_box(position)
    return cube_around(position.min(axis=1), position.max(axis=1), low, high)


def central_box(position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The box (lower, upper corner; float64) of the central bodies of ``position`` (3, n):
    the axis quantiles ``CUBE_TAIL`` and ``1 - CUBE_TAIL`` of a strided sample of
    :data:`CUBE_SAMPLE` bodies."""
    sample = position[:, ::max(1, position.shape[1] // CUBE_SAMPLE)].astype(np.float64)
    low, high = np.quantile(sample, [CUBE_TAIL, 1 - CUBE_TAIL], axis=1)
    return low, high


def cube_around(lo: np.ndarray, hi: np.ndarray, low: np.ndarray, high: np.ndarray
                ) -> tuple[np.ndarray, float]:
    """The key cube (lower corner, edge; float64) of bodies within ``lo..hi`` whose central
    bodies are within ``low..high`` (:func:`central_box`): the bounding cube, or, when that
    is more than :data:`OUTLIER_SPAN` times wider than the central box, a cube of four times
    that box around its centre (:func:`key_cube`)."""
    lo = np.asarray(lo, dtype=np.float64)
    size = float((np.asarray(hi, dtype=np.float64) - lo).max())
    size = size * (1 + 1e-9) if size > 0 else 1.0
    span = float((high - low).max())
    if span > 0 and size > OUTLIER_SPAN * span:
        return 0.5 * (low + high) - 2 * span, 4 * span
    return lo, size


def build(position: np.ndarray, mass: np.ndarray, leaf_size: int,
          cube: np.ndarray | None = None) -> TileTree:
    """The octree and moments of bodies ``position`` (3, n) with masses ``mass``.

    Keys are taken in ``cube`` (``[lower corner (3), edge]``, float64, holding every body:
    the cube of all tiles, so that their cells are cells of one octree) or, if None, in the
    bodies' own cube (:func:`key_cube`: their bounding cube, or, with far outliers, a cube
    around the others); the bodies are sorted by key (stably, so equal keys keep their input
    order) and the result depends only on the inputs.
    """
    position = np.ascontiguousarray(position)
    dtype = position.dtype
    n = position.shape[1]
    if cube is not None:
        lo, size = np.asarray(cube[:3], dtype=np.float64), float(cube[3])
    elif n == 0:
        lo, size = np.zeros(3), 1.0
    else:
        lo, size = key_cube(position)
    keys = morton_keys(position[0], position[1], position[2], lo, size)
    order = np.argsort(keys, kind="stable")
    x, y, z = (take(position[a], order) for a in range(3))
    m = take(np.ascontiguousarray(mass, dtype=dtype), order)
    if n == 0:
        start = end = skip = np.zeros(0, dtype=np.int64)
        leaf = np.zeros(0, dtype=np.bool_)
    else:
        start, end, skip, leaf = build_tree(take(keys, order), leaf_size)
    cmass, com, quad, bmax = cell_moments(x, y, z, m, start, end)
    return TileTree(order, x, y, z, m, start, end, skip, leaf, cmass, com, quad, bmax,
                    acceptable_cells(start, end, leaf))


def refit(tree: TileTree, position: np.ndarray, mass: np.ndarray) -> TileTree:
    """The tree of the same bodies at new positions, with the cells of ``tree``.

    The bodies keep their order and cells (the topology is not rebuilt), so between two
    re-tilings every cell holds the same bodies and its centre and size move no faster than
    they do; only the moments are recomputed. ``position`` and ``mass`` are in the input
    order of :func:`build`.
    """
    position = np.ascontiguousarray(position)
    x, y, z = (take(position[a], tree.order) for a in range(3))
    m = take(np.ascontiguousarray(mass, dtype=position.dtype), tree.order)
    cmass, com, quad, bmax = cell_moments(x, y, z, m, tree.start, tree.end)
    return TileTree(tree.order, x, y, z, m, tree.start, tree.end, tree.skip, tree.leaf,
                    cmass, com, quad, bmax, tree.acceptable)
