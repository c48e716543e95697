"""Far tiles from summaries: which tile pairs are near, and the far field of the rest
(no Dask).

A tile's :class:`Summary` is the top of its tree (cells down to :data:`~nbody_dask.kernels.
octree.SUMMARY_BODIES` bodies) and the spheres of its target groups; all tiles' summaries
form a :class:`Forest`. :func:`near_sources` classifies each target tile's sources near or
far, with the opening test grown by how far the bodies may move; :func:`far_walk` evaluates
a target's far tiles from their summaries alone, and raises :class:`FarFieldError` if the
bodies moved farther than that margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from .law import JIT_OPTIONS as _JIT
from .octree import SUMMARY_BODIES, TileTree
from .walk import accepted_m2p, beyond, group_sphere, moment_table, walk_table

__all__ = ["Summary", "summarize", "Forest", "forest", "FarFieldError", "far_walk_sorted",
           "far_walk", "near_sources", "displacement_bound"]

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

    @property
    def cells(self) -> tuple:
        """What a far walk reads of the forest: ``(roots, skip, leaf, mass, com, quad, bmax,
        acceptable)``."""
        return (self.roots, self.skip, self.leaf, self.mass, self.com, self.quad, self.bmax,
                self.acceptable)


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


@njit(parallel=True, **_JIT)
def far_walk_sorted(targets, cells, far, eps2, theta, with_potential, chunks):
    """Forces (G = 1) on the bodies of a target tree by the far source tiles of a forest of
    tree summaries (:class:`Forest`): one walk per target leaf over the summaries of tiles
    ``far`` (in that order), every accepted cell through the M2P kernel.

    ``targets`` is the target tree's :attr:`~nbody_dask.kernels.octree.TileTree.targets`,
    ``cells`` the forest's :attr:`Forest.cells`. A summary leaf that fails the opening test
    would need the tile's bodies: it adds nothing and is counted. Returns the forces (3 or
    4 rows, in the targets' sorted order) and that count, which is 0 whenever the tiles
    ``far`` were classified far (:func:`near_sources`) with a margin the bodies kept to.
    """
    tx, ty, tz, tstart, tend, tleaf = targets
    roots, skip, leaf, mass, com, quad, bmax, acceptable = cells
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
    n_cells = skip.shape[0]
    inv_theta = 1.0 / theta
    moments = moment_table(mass, com, quad, dtype)
    table = walk_table(mass, com, bmax, acceptable, inv_theta)
    for chunk in prange(chunks):
        accepted = np.empty(n_cells, dtype=np.int64)
        gathered = np.empty((10, n_cells), dtype=dtype)
        for g in range(chunk * n_groups // chunks, (chunk + 1) * n_groups // chunks):
            cell = groups[g]
            lo, hi = tstart[cell], tend[cell]
            gcx, gcy, gcz, radius = group_sphere(tx, ty, tz, lo, hi)
            n_acc = 0
            for f in range(far.shape[0]):
                k = roots[far[f]]
                while k < roots[far[f] + 1]:
                    if mass[k] == 0.0:  # adds nothing
                        k = skip[k]
                    elif beyond(table, k, gcx, gcy, gcz, radius):
                        accepted[n_acc] = k
                        n_acc += 1
                        k = skip[k]
                    elif leaf[k]:
                        failed[chunk] += 1
                        k = skip[k]
                    else:
                        k += 1
            part = np.zeros((rows, hi - lo), dtype=dtype)
            accepted_m2p(tx, ty, tz, lo, hi, moments, accepted, n_acc, gathered, eps2, part)
            out[:, lo:hi] = part
    return out, failed.sum()


def far_walk(target: TileTree, trees: Forest, far: np.ndarray, eps2: Any,
             theta: float, with_potential: bool = False) -> np.ndarray:
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
    sorted_out, failed = far_walk_sorted(target.targets, trees.cells, far, eps2, float(theta),
                                         bool(with_potential), 8 * numba.get_num_threads())
    if failed:
        raise FarFieldError(
            f"{failed} target group(s) came too close to cells of far tiles {far.tolist()}: the "
            "bodies moved farther between re-tilings than the near/far margin allowed")
    out = np.empty_like(sorted_out)
    out[:, target.order] = sorted_out
    return out


@njit(**_JIT)
def _group_spheres(x, y, z, start, end, leaf):
    """The sphere (:func:`group_sphere`) of every leaf: shape (4, leaves), centre and
    radius."""
    leaves = np.flatnonzero(leaf)
    out = np.empty((4, leaves.shape[0]))
    for g in range(leaves.shape[0]):
        k = leaves[g]
        out[0, g], out[1, g], out[2, g], out[3, g] = group_sphere(x, y, z, start[k], end[k])
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
