"""The functions the workers run: one per kind of task of a run's graphs, no graph code.

Each is a plain function of tiles, arrays and small frozen parameter records
(:class:`Forces`, :class:`Closing`, :class:`Walk`); :mod:`nbody_dask.graph` and the force
methods (:mod:`nbody_dask.methods`) only arrange them into graphs, and never call a kernel.

Partial forces are arrays of shape (3, n) or (4, n) (the potential in row 3), with G = 1;
G is applied once, after the reduction, by :func:`close`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .backends import tile_kernels
from .bodies import Tile, wrap
from .diagnostics import tile_diagnostics
from .integrators import check_finite, close_block, close_step, drifted, open_block, peculiar
from .kernels import cpu, ewald, pm, rows, shortrange
from .kernels import tree as trees
from .location import StoreLocation
from .plan import reduction_groups
from . import sizes  # noqa: F401  (Dask weighs the tiles, trees and meshes the tasks return)
from .spatial import periodic_neighbours, tile_extent
from .storage import write_tile
from .timebins import BlockFactors, Bins, active_mask, bin_counts

__all__ = ["Forces", "Closing", "Walk", "PairForces", "pair_forces", "symmetric_pair_forces",
           "self_forces", "gather_sources", "row_forces", "tile_tree", "tree_pair_forces",
           "refit_tree", "tree_summary", "tree_forest", "near_now", "tile_motion",
           "near_in_window", "far_forces", "sum_in_order", "sum_sides", "reduce_in_groups",
           "close", "close_row", "close_tree_row", "write_and_measure", "merge_picked",
           "append", "Periodic", "ShortTree", "ewald_pair_forces", "ewald_factors",
           "ewald_long_forces", "short_tree", "short_pair_forces",
           "mesh_deposit", "mesh_solve", "mesh_forces", "periodic_layout",
           "mesh_slab", "mesh_mass", "mesh_forces_from_slabs", "tile_span", "region_planes",
           "span_planes", "mesh_forces_from_span", "close_short_row", "reduce_levels",
           "Tick", "open_tile_block", "drift_tile", "active_pair_forces", "close_active",
           "tile_bin_counts", "drifted_tree", "active_tree_pair_forces", "drifted_short_tree",
           "active_short_pair_forces"]


@dataclass(frozen=True)
class Forces:
    """What a force task computes: the softening, and the potential too (snapshot steps)."""

    softening: float
    with_potential: bool

    def eps2(self, dtype: Any):
        """Squared softening in ``dtype`` (no float64 enters a float32 kernel)."""
        ftype = np.dtype(dtype).type
        return ftype(self.softening) * ftype(self.softening)


@dataclass(frozen=True)
class Closing:
    """What a closing task does after the reduction: multiply by ``G``, kick by ``kick``
    (None: the initial evaluation, no kick), round a comoving run's momenta at a snapshot
    step (``scale``, see :func:`~nbody_dask.integrators.close_step`), and check the state of
    ``step`` is finite."""

    step: int
    G: float
    kick: float | None
    scale: float | None = None


@dataclass(frozen=True)
class Walk:
    """A tree walk's parameters: the forces, the opening angle, the Numba ``threads`` of
    the task (None: every core; the result does not depend on them)."""

    forces: Forces
    theta: float
    threads: int | None


@dataclass(frozen=True)
class Periodic:
    """A periodic cube's force parameters: its side ``box``; for TreePM the mesh points per
    side, the split scale ``r_s`` and the short-range ``cutoff`` (length units), the
    short-range walk's ``theta`` and the Numba and FFT ``threads`` of a task (None: every
    core; the result does not depend on them), and the short range's ``backend``
    (``"cuda"``: every pair of two near tiles on the GPU instead of the walk)."""

    box: float
    mesh: int | None = None
    split: float = 0.0
    cutoff: float = 0.0
    theta: float = 0.0
    threads: int | None = None
    backend: str = "cpu"


class PairForces(NamedTuple):
    """The result of a symmetric tile-pair task: the forces on each of its two tiles."""

    on_target: np.ndarray
    on_source: np.ndarray


# -- direct summation --------------------------------------------------------------------------

def pair_forces(target: Tile, source: Tile, forces: Forces, backend: str = "cpu") -> np.ndarray:
    """Partial forces on ``target`` due to ``source``; one kernel call of ``backend``."""
    kernels = tile_kernels(backend)
    return kernels.tile_pair_forces(target.position, source.position, source.mass,
                                    forces.eps2(target.position.dtype), forces.with_potential,
                                    target.start == source.start)


def symmetric_pair_forces(target: Tile, source: Tile, forces: Forces) -> PairForces:
    """Partial forces on both tiles of a pair of distinct tiles; one CPU kernel call."""
    return PairForces(*cpu.symmetric_pair_forces(
        target.position, target.mass, source.position, source.mass,
        forces.eps2(target.position.dtype), forces.with_potential))


def self_forces(tile: Tile, forces: Forces) -> np.ndarray:
    """Partial forces of a tile on itself, each pair once; one CPU kernel call."""
    return cpu.self_tile_forces(tile.position, tile.mass, forces.eps2(tile.position.dtype),
                                forces.with_potential)


def gather_sources(*tiles: Tile) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Positions (3, n) and masses of consecutive tiles in one block, and the tiles' sizes."""
    return (np.concatenate([t.position for t in tiles], axis=1),
            np.concatenate([t.mass for t in tiles]), [t.size for t in tiles])


def row_forces(target: int, own: Tile, blocks: Sequence[tuple], forces: Forces,
               threads: int | None = None) -> list[np.ndarray]:
    """Partial forces on tile ``own`` (number ``target``) due to every tile, with the
    parallel kernel; ``blocks`` are :func:`gather_sources` of all tiles, in order.

    Entry ``j`` is bit-identical to :func:`pair_forces` of ``(own, tile j)`` on the CPU, for
    any number of ``threads`` (None: every core).
    """
    position = np.concatenate([b[0] for b in blocks], axis=1)
    mass = np.concatenate([b[1] for b in blocks])
    starts = np.cumsum([0] + [size for b in blocks for size in b[2]], dtype=np.int64)
    rows.set_threads(threads)
    out = rows.row_forces(*own.position, *position, mass, starts,
                          forces.eps2(own.position.dtype), forces.with_potential, target)
    return list(out)


# -- individual time steps (nbody_dask.timebins, nbody_dask.blocksteps) -----------------------

@dataclass(frozen=True)
class Tick:
    """One tick of a block of individual time steps: its number (``bins.ticks``: the
    block's end), the run's :class:`~nbody_dask.timebins.Bins`, whether it is the
    first evaluation of a run or resume (every body active, no kick), the step (block) it
    belongs to, for error messages, and the kernel threads of a force task (1: the serial
    kernel, for tasks that share a worker; None: every core; the result does not depend on
    them), and a comoving run's block on its timeline (:meth:`~nbody_dask.plan.Plan.
    block_factors`; None for a static run)."""

    tick: int
    bins: Bins
    initial: bool
    step: int
    threads: int | None = 1
    factors: BlockFactors | None = None

    def active(self, tile: Tile, forces: Forces | None = None) -> np.ndarray | None:
        """The tile's bodies active at this tick (None: all of them); a force task passes
        its ``forces``, whose potentials are computed only where every body is active."""
        if self.initial or self.tick == self.bins.ticks:
            return None
        mask = active_mask(tile.time_bin, self.tick, self.bins.bins)
        if mask.all():
            return None
        if forces is not None and forces.with_potential:
            raise ValueError("potentials are computed where every body is active")
        return mask


def open_tile_block(tile: Tile, bins: Bins, factors: BlockFactors | None = None) -> Tile:
    """A block's opening half-kicks of a tile's bodies (a comoving block's ``factors``)."""
    return open_block(tile, bins, factors)


def drift_tile(tile: Tile, drift: float, box: float | None = None) -> Tile:
    """The tile drifted by the factor ``drift`` (wrapped into a periodic cube of side
    ``box``, if given)."""
    position = drifted(tile, drift)
    return tile.evolve(position=position if box is None else wrap(position, box))


def active_pair_forces(target: Tile, source: Tile, source_drift: float, tick: Tick,
                       forces: Forces, backend: str = "cpu") -> np.ndarray:
    """Partial forces on the bodies of ``target`` (drifted to the tick) active at ``tick``,
    in tile order, due to ``source`` drifted by ``source_drift``; one kernel call. With the
    pairwise criterion a last row holds the pairs' rates
    (:func:`~nbody_dask.kernels.cpu.accel_rate_tile`, on GPUs
    :func:`~nbody_dask.kernels.cuda.tile_pair_rate_forces`); with the acceleration criterion and
    every body active it is :func:`pair_forces` exactly."""
    active = tick.active(target, forces)
    position = target.position if active is None else np.ascontiguousarray(
        target.position[:, active])
    sources = drifted(source, source_drift)
    same = target.start == source.start
    eps2 = forces.eps2(position.dtype)
    if tick.bins.pairwise:  # the kernel that also sums the pairs' rates
        mass = target.mass if active is None else target.mass[active]
        own = (np.arange(target.size) if active is None else np.flatnonzero(active)) \
            if same else np.full(mass.shape[0], -1)
        if backend == "cuda":
            return tile_kernels(backend).tile_pair_rate_forces(
                position, mass, own, sources, source.mass, eps2, forces.with_potential)
        if tick.threads == 1 or mass.shape[0] <= rows.TARGET_BLOCK:  # one block: serial
            return cpu.accel_rate_tile(*position, mass, own, *sources, source.mass, eps2,
                                       forces.with_potential)
        rows.set_threads(tick.threads)
        return rows.rate_forces(*position, mass, own, *sources, source.mass, eps2,
                                forces.with_potential)
    if tick.threads != 1 and backend == "cpu" and position.shape[1] > rows.TARGET_BLOCK:
        # the serial kernel's bits, on every core
        rows.set_threads(tick.threads)
        return rows.row_forces(*position, *sources, source.mass,
                               np.array([0, source.size], dtype=np.int64), eps2,
                               forces.with_potential, 0 if active is None and same else -1)[0]
    kernels = tile_kernels(backend)
    return kernels.tile_pair_forces(position, sources, source.mass, eps2,
                                    forces.with_potential, active is None and same)


def drifted_tree(tree: trees.TileTree, tile: Tile, drift: float) -> trees.TileTree:
    """``tree`` (of the tile at its block's start) refit to the tile drifted by ``drift``:
    the same cells, their moments and sizes at the new positions."""
    return trees.refit(tree, drifted(tile, drift), tile.mass)


def active_tree_pair_forces(target: Tile, targets: trees.TileTree, source: trees.TileTree,
                            tick: Tick, walk: Walk, same: bool) -> np.ndarray:
    """Partial forces on the bodies of ``target`` (drifted to the tick) active at ``tick``,
    in tile order, due to a source tile's refit tree; ``targets`` is the target's refit
    tree (``same``: they are one). The leaves of ``targets`` with active bodies walk the
    source for those bodies alone, each body's forces exactly as if every body were active;
    with the pairwise criterion a last row holds the rates of the pairs summed directly
    (:func:`~nbody_dask.kernels.walk.walk`)."""
    active = tick.active(target, walk.forces)
    rows.set_threads(walk.threads)
    out = trees.walk(targets, source, walk.forces.eps2(source.x.dtype), walk.theta,
                     walk.forces.with_potential, same, tick.bins.pairwise, active)
    return out if active is None else np.ascontiguousarray(out[:, active])


def close_active(closing: Closing, tick: Tick, tile: Tile, long: np.ndarray | None,
                 sides: Sequence[int | None], *parts: Any) -> Tile:
    """Sum the last partials of a tile's active bodies, kick them, give them their new
    bins (:func:`~nbody_dask.integrators.close_block`, with the ``long``-range forces where
    a method has them), and check the state is finite."""
    active = tick.active(tile)
    return check_finite(close_block(tile, sum_sides(sides, *parts), closing.G, tick.tick,
                                    tick.bins, tick.initial, active, long, tick.factors,
                                    closing.scale),
                        closing.step, active)


def tile_bin_counts(bins: int, *tiles: Tile) -> list[tuple[int, ...]]:
    """How many bodies each bin holds, per tile (what the graph builder plans from)."""
    return [bin_counts(tile.time_bin, bins) for tile in tiles]


# -- the tree ----------------------------------------------------------------------------------

def tile_tree(tile: Tile, leaf_size: int, cube: np.ndarray | None = None) -> trees.TileTree:
    """The tile's octree and moments, its keys in the ``cube`` of all tiles
    (:func:`~nbody_dask.spatial.bounding_cube`; None: the tile's own)."""
    return trees.build(tile.position, tile.mass, leaf_size, cube)


def tree_pair_forces(target: trees.TileTree, source: trees.TileTree, walk: Walk,
                     same: bool) -> np.ndarray:
    """Partial forces on tile tree ``target`` due to tile tree ``source`` (``same``: they
    are one tree): one group walk per target leaf, in the target tile's order."""
    rows.set_threads(walk.threads)
    return trees.walk(target, source, walk.forces.eps2(target.x.dtype), walk.theta,
                      walk.forces.with_potential, same)


def refit_tree(tree: trees.TileTree, tile: Tile) -> trees.TileTree:
    """The tile's tree at its new positions, with the cells of ``tree`` (built at the last
    re-tiling from the same bodies)."""
    return trees.refit(tree, tile.position, tile.mass)


def tree_summary(tree: trees.TileTree) -> trees.Summary:
    """The tile tree's top cells and target groups: what the other tiles need of it."""
    return trees.summarize(tree)


def tree_forest(*summaries: trees.Summary) -> trees.Forest:
    """All tiles' summaries in one forest, in tile order."""
    return trees.forest(*summaries)


def near_now(forest: trees.Forest, theta: float) -> list[list[int]]:
    """Each target tile's near source tiles for the positions the forest was built from."""
    return trees.near_sources(forest, theta)


def tile_motion(tile: Tile) -> np.ndarray:
    """The tile's largest speed and acceleration, float64."""
    def largest(v: np.ndarray) -> float:
        return float(np.sqrt((v.astype(np.float64) ** 2).sum(axis=0)).max(initial=0.0))

    return np.array([largest(tile.velocity), largest(tile.acceleration)])


def near_in_window(forest: trees.Forest, theta: float, duration: float,
                   *motions: np.ndarray) -> list[list[int]]:
    """Each target tile's near source tiles for the next ``duration`` of time: the forest's
    test is grown by how far a body can move in it, from the tiles' ``motions``
    (:func:`tile_motion`)."""
    speed, acceleration = np.max(motions, axis=0)
    return trees.near_sources(forest, theta,
                              trees.displacement_bound(speed, acceleration, duration))


def far_forces(step: int, target: trees.TileTree, forest: trees.Forest, far: list[int],
               walk: Walk) -> np.ndarray:
    """Partial forces on tile tree ``target`` due to the tiles ``far``, from their summaries
    in ``forest``; its :class:`~nbody_dask.kernels.tree.FarFieldError` names ``step``."""
    rows.set_threads(walk.threads)
    try:
        return trees.far_walk(target, forest, np.array(far, dtype=np.int64),
                              walk.forces.eps2(target.x.dtype), walk.theta,
                              walk.forces.with_potential)
    except trees.FarFieldError as exc:
        raise trees.FarFieldError(f"step {step}: {exc}", step) from None


# -- periodic boxes: Ewald sums ----------------------------------------------------------------

def _rows(values: np.ndarray, forces: Forces, dtype: Any) -> np.ndarray:
    """A (4, n) float64 result as the partial forces of a tile: 3 or 4 rows, its dtype."""
    return values[:4 if forces.with_potential else 3].astype(dtype)


def ewald_pair_forces(target: Tile, source: Tile, forces: Forces, box: float) -> np.ndarray:
    """Real-space Ewald partial forces on ``target`` due to ``source`` and its images
    (:func:`~nbody_dask.kernels.ewald.real_space`), in float64, returned in the tile's dtype."""
    t, s = target.position, source.position
    alpha = ewald.default_alpha(box)
    out = ewald.real_space(t[0], t[1], t[2], s[0], s[1], s[2], source.mass, float(box), alpha,
                           float(forces.softening) ** 2, target.start == source.start)
    return _rows(out, forces, t.dtype)


def ewald_factors(tile: Tile, box: float) -> np.ndarray:
    """The tile's structure factors over the Ewald wave vectors, and its mass as the last
    entry (complex128): partial sums that add up over tiles."""
    p = tile.position
    vectors = ewald.wave_vectors(box, ewald.default_alpha(box))
    factors = ewald.structure_factors(p[0], p[1], p[2], tile.mass, float(box), vectors)
    return np.append(factors, tile.mass.sum(dtype=np.float64))


def ewald_long_forces(tile: Tile, forces: Forces, box: float, *parts: np.ndarray
                      ) -> np.ndarray:
    """Reciprocal-space Ewald partial forces on ``tile`` from the structure factors of all
    tiles (the last ``parts`` of their fixed-order sum, added here in order)."""
    total = sum_in_order(*parts)
    alpha = ewald.default_alpha(box)
    p = tile.position
    out = ewald.reciprocal_space(p[0], p[1], p[2], float(box), alpha,
                                 ewald.wave_vectors(box, alpha), total[:-1], total[-1].real)
    return _rows(out, forces, p.dtype)


# -- periodic boxes: TreePM --------------------------------------------------------------------

class ShortTree(NamedTuple):
    """A tile's tree for the short-range walk and its cells' second-moment traces."""

    tree: trees.TileTree
    spread: np.ndarray


def short_tree(tile: Tile, leaf_size: int, cube: np.ndarray | None = None) -> ShortTree:
    """The tile's octree (keys in ``cube``, as :func:`tile_tree`) for the short range."""
    tree = trees.build(tile.position, tile.mass, leaf_size, cube)
    return ShortTree(tree, shortrange.spread_of(tree))


def short_pair_forces(target: ShortTree, source: ShortTree, forces: Forces,
                      periodic: Periodic) -> np.ndarray:
    """Short-range partial forces on tile tree ``target`` due to tile tree ``source``: one
    periodic walk with the cutoff (:func:`~nbody_dask.kernels.shortrange.short_walk`), or
    with ``periodic.backend == "cuda"`` every pair on the GPU
    (:func:`~nbody_dask.kernels.cuda.short_pair_forces`)."""
    if periodic.backend == "cuda":
        from .kernels import cuda

        t, s = target.tree, source.tree
        in_tree_order = cuda.short_pair_forces((t.x, t.y, t.z), (s.x, s.y, s.z), s.m,
                                               forces.eps2(t.x.dtype), periodic.box,
                                               periodic.split, periodic.cutoff,
                                               forces.with_potential)
        out = np.empty_like(in_tree_order)
        out[:, t.order] = in_tree_order
        return out
    rows.set_threads(periodic.threads)
    return shortrange.short_walk(target.tree, source.tree, forces.eps2(target.tree.x.dtype),
                                 periodic.theta, periodic.box, periodic.split,
                                 periodic.cutoff, forces.with_potential, source.spread)


def drifted_short_tree(tree: ShortTree, tile: Tile, drift: float) -> ShortTree:
    """``tree`` (of the tile at its block's start) refit to the tile drifted by ``drift``,
    and its cells' second-moment traces there."""
    refit = trees.refit(tree.tree, drifted(tile, drift), tile.mass)
    return ShortTree(refit, shortrange.spread_of(refit))


def active_short_pair_forces(target: Tile, targets: ShortTree, source: ShortTree,
                             tick: Tick, forces: Forces, periodic: Periodic) -> np.ndarray:
    """Short-range partial forces on the bodies of ``target`` (drifted to the tick) active
    at ``tick``, in tile order, due to a source tile's tree; ``targets`` is the target's
    tree at the tick. Only the walk's groups with an active body walk, each body's forces
    exactly as if every body were active."""
    active = tick.active(target, forces)
    rows.set_threads(periodic.threads)
    out = shortrange.short_walk(targets.tree, source.tree, forces.eps2(target.position.dtype),
                                periodic.theta, periodic.box, periodic.split,
                                periodic.cutoff, forces.with_potential, source.spread, active)
    return out if active is None else np.ascontiguousarray(out[:, active])


def mesh_deposit(tile: Tile, periodic: Periodic) -> pm.Region:
    """The tile's partial mesh (TSC mass on the region its bodies touch)."""
    return pm.deposit(tile.position, tile.mass, periodic.box, periodic.mesh, "tsc")


def mesh_solve(periodic: Periodic, dtype: str, with_potential: bool,
               *parts: pm.Region | np.ndarray) -> pm.LongRange:
    """The last partial meshes added in order, and the long-range accelerations (and
    potential) on the mesh by FFT on the task's threads."""
    mesh = pm.mesh_sum(periodic.mesh, dtype, *parts)
    return pm.long_range(mesh, periodic.box, periodic.split, with_potential, "tsc",
                         periodic.threads or -1)


def mesh_forces(tile: Tile, solved: pm.LongRange, periodic: Periodic) -> np.ndarray:
    """Long-range partial forces on ``tile``, interpolated from the solved mesh."""
    return pm.interpolate(tile.position, tile.mass, solved, periodic.box, periodic.split,
                          "tsc")


def periodic_layout(periodic: Periodic, *extents: np.ndarray
                    ) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """From the tiles' extents (:func:`~nbody_dask.spatial.tile_extent`): each tile's near
    tiles (within the cutoff) and the mesh planes along the first axis that its weights
    touch, ``(first, count)``."""
    near = periodic_neighbours(periodic.box, periodic.cutoff, *extents)
    return near, [_span(extent, periodic) for extent in extents]


def _span(extent: np.ndarray, periodic: Periodic) -> tuple[int, int]:
    """The mesh planes along the first axis that the weights of bodies within ``extent``
    (:func:`~nbody_dask.spatial.tile_extent`) touch, ``(first, count)``."""
    return pm.cell_span(np.asarray(extent)[:, 0], periodic.mesh / periodic.box,
                        periodic.mesh, pm.POINTS["tsc"])


def mesh_slab(mesh: int, dtype: str, lo: int, hi: int, *parts: pm.Region | np.ndarray
              ) -> np.ndarray:
    """Planes ``lo .. hi - 1`` of the partial meshes added in order (:func:`~nbody_dask.
    kernels.pm.slab_sum`)."""
    return pm.slab_sum(mesh, dtype, lo, hi, *parts)


def mesh_mass(*slabs: np.ndarray) -> float:
    """The mesh's total mass, its slabs' sums added in order (float64)."""
    return float(sum(slab.sum(dtype=np.float64) for slab in slabs))


def mesh_forces_from_slabs(tile: Tile, periodic: Periodic, total_mass: float, first: int,
                           rows: int, planes: Sequence[tuple[int, int]],
                           *parts: np.ndarray) -> np.ndarray:
    """Long-range partial forces on ``tile`` from the planes of the solved fields that its
    weights touch, from plane ``first`` on (modulo the mesh): ``parts`` are, field by
    field (``rows`` of them), slabs or planes cut from them, of which the tile reads
    ``parts[k][slice(*planes[k])]``, in order (:func:`~nbody_dask.kernels.pm.span_pieces`),
    joined a field at a time."""
    pieces = [part[lo:hi] for part, (lo, hi) in zip(parts, planes, strict=True)]
    per_field = len(pieces) // rows
    return pm.interpolate_planes(
        tile.position, tile.mass,
        _JoinedPlanes([pieces[r * per_field:(r + 1) * per_field] for r in range(rows)]),
        first, total_mass, periodic.box, periodic.split, "tsc")


def tile_span(tile: Tile, periodic: Periodic) -> tuple[int, int]:
    """The mesh planes along the first axis that ``tile``'s weights touch, ``(first,
    count)``: :func:`periodic_layout`'s span, from the tile itself (where the graph is
    built before any extent is known)."""
    return _span(tile_extent(tile), periodic)


def region_planes(region: pm.Region, mesh: int, lo: int, hi: int) -> pm.Region:
    """The rows of a partial mesh from its first to its last on planes ``lo .. hi - 1``
    (modulo ``mesh``; none where it has none there): what a slab's sum
    (:func:`~nbody_dask.kernels.pm.slab_sum`) reads of it, so that no more travels."""
    rows = (region.start[0] + np.arange(region.values.shape[0])) % mesh
    inside = np.flatnonzero((rows >= lo) & (rows < hi))
    if inside.size == 0:
        return pm.Region(region.start, region.values[:0])
    first, last = int(inside[0]), int(inside[-1]) + 1
    return pm.Region((region.start[0] + first, *region.start[1:]),
                     region.values[first:last].copy())


def span_planes(span: tuple[int, int], slab: np.ndarray, bounds: Sequence[tuple[int, int]],
                index: int) -> tuple[np.ndarray, ...]:
    """The planes of slab ``index`` (of ``bounds``) within ``span`` (:func:`tile_span`),
    copied, each run of them in the span's order (:func:`~nbody_dask.kernels.pm.
    span_pieces`; none where the span misses the slab)."""
    return tuple(slab[start:stop].copy()
                 for j, start, stop in pm.span_pieces(bounds, *span) if j == index)


def mesh_forces_from_span(tile: Tile, periodic: Periodic, total_mass: float,
                          span: tuple[int, int], rows: int,
                          bounds: Sequence[tuple[int, int]],
                          *pieces: tuple[np.ndarray, ...]) -> np.ndarray:
    """:func:`mesh_forces_from_slabs` from :func:`span_planes` of every slab of every
    field (``pieces``, field by field, slab by slab), joined in the span's order."""
    slabs = len(bounds)
    joined = []
    for r in range(rows):
        taken = [0] * slabs
        field = []
        for j, _, _ in pm.span_pieces(bounds, *span):
            field.append(pieces[r * slabs + j][taken[j]])
            taken[j] += 1
        joined.append(tuple(field))
    return pm.interpolate_planes(tile.position, tile.mass, _JoinedPlanes(joined), span[0],
                                 total_mass, periodic.box, periodic.split, "tsc")


class _JoinedPlanes(Sequence):
    """Each field's planes, joined from their pieces when asked (one field's at a time)."""

    def __init__(self, pieces: list[tuple[np.ndarray, ...]]) -> None:
        self.pieces = pieces

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, row: int) -> np.ndarray:  # type: ignore[override]
        pieces = self.pieces[row]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)


# -- reductions and the closing kick -----------------------------------------------------------

def sum_in_order(*parts: np.ndarray) -> np.ndarray:
    """Sum arrays left to right (a fixed order, hence a reproducible rounding)."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def sum_sides(sides: Sequence[int | None], *parts: Any) -> np.ndarray:
    """:func:`sum_in_order` of partial forces, where ``parts[k]`` is an array when
    ``sides[k]`` is None and a :class:`PairForces`, of which side ``sides[k]`` is wanted,
    otherwise."""
    return sum_in_order(*(p if side is None else p[side]
                          for p, side in zip(parts, sides, strict=True)))


def reduce_in_groups(parts: list, groups: list[list[tuple[int, int]]]) -> np.ndarray:
    """Sum partial forces with a plan's reduction tree, as the combine tasks would."""
    return sum_in_order(*_levels(parts, groups))


def reduce_levels(split_every: int, *parts: np.ndarray) -> list[np.ndarray]:
    """:func:`reduce_in_groups` but the last sum: the partials that the combine tasks of
    the reduction tree of ``len(parts)`` would leave for the closing task."""
    return _levels(list(parts), reduction_groups(len(parts), split_every))


def _levels(parts: list, groups: list[list[tuple[int, int]]]) -> list:
    """The partials left after every level of the reduction tree ``groups``."""
    for level in groups:
        parts = [sum_in_order(*parts[lo:hi]) for lo, hi in level]
    return parts


def _kicked(closing: Closing, tile: Tile, forces: np.ndarray) -> Tile:
    """``tile`` with ``forces`` attached (times G), kicked, and checked finite."""
    return check_finite(close_step(tile, forces, closing.G, closing.kick, closing.scale),
                        closing.step)


def close(closing: Closing, tile: Tile, sides: Sequence[int | None], *parts: Any) -> Tile:
    """Sum the last partials, attach the forces, kick, and check the state is finite."""
    return _kicked(closing, tile, sum_sides(sides, *parts))


def close_row(closing: Closing, target: int, forces: Forces, groups: list,
              threads: int | None, own: Tile, *blocks: tuple) -> Tile:
    """The ``"rows"`` layout's task: a target tile's whole row of forces, summed with the
    plan's ``groups`` and kicked."""
    parts = row_forces(target, own, blocks, forces, threads)
    return _kicked(closing, own, reduce_in_groups(parts, groups))


def close_tree_row(closing: Closing, target: int, walk: Walk, split_every: int, tile: Tile,
                   tree: trees.TileTree, near: list[int], far: list[int],
                   forest: trees.Forest | None, *near_trees: trees.TileTree) -> Tile:
    """The ``"rows"`` layout's tree task: tile ``target``'s walks of its ``near`` tiles (their
    ``near_trees``, in source order) and of its ``far`` tiles' summaries in ``forest``,
    summed with the fixed groups that the ``"pairs"`` layout's combine tasks use (so the two
    layouts give the same bits), and the kick."""
    parts = [tree_pair_forces(tree, source, walk, j == target)
             for j, source in zip(near, near_trees, strict=True)]
    if far:
        parts.append(far_forces(closing.step, tree, forest, far, walk))
    forces = reduce_in_groups(parts, reduction_groups(len(parts), split_every))
    return _kicked(closing, tile, forces)


def close_short_row(closing: Closing, forces: Forces, periodic: Periodic, split_every: int,
                    tile: Tile, tree: ShortTree, long: np.ndarray, *near_trees: ShortTree
                    ) -> Tile:
    """TreePM's ``"rows"`` task: a tile's short-range walks of its near tiles (their trees,
    in source order, on the task's threads) and its mesh part, summed with the fixed groups
    of the ``"pairs"`` layout's combine tasks (the same bits), and the kick."""
    parts = [short_pair_forces(tree, source, forces, periodic) for source in near_trees]
    parts.append(long)
    return _kicked(closing, tile, reduce_in_groups(parts, reduction_groups(len(parts),
                                                                           split_every)))


# -- snapshots and moving bodies between tiles -------------------------------------------------

def write_and_measure(path: StoreLocation | None, index: int, tile: Tile, G: float, run: str,
                      writer: str, scale: float | None = None) -> np.ndarray:
    """Write a tile's region of snapshot ``index`` (unless ``path`` is None); its diagnostics.
    A comoving run's tile (``scale``: the scale factor) is written and measured with
    peculiar velocities and potential (:func:`~nbody_dask.integrators.peculiar`)."""
    if scale is not None:
        tile = peculiar(tile, scale)
    if path is not None:
        write_tile(path, index, tile, run, writer)
    return tile_diagnostics(tile, G)


def merge_picked(offset: int, merge: Any, head: list, *blocks: list) -> Tile:
    """``merge(*head, *parts)``, the parts being entry ``offset`` of each block of parts."""
    return merge(*head, *(block[offset] for block in blocks))


def append(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The two vectors one after the other (a snapshot's diagnostics and force errors)."""
    return np.concatenate([first, second])
