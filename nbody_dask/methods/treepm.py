"""TreePM: periodic boxes, a particle mesh for the long range and a tree walk for the rest.

Gravity in a periodic cube of side ``L`` (:attr:`~nbody_dask.plan.Plan.box_size`, the mean
density subtracted) is split with a Gaussian of scale ``r_s`` (:attr:`~nbody_dask.plan.Plan.
split` mesh cells):

* the **long range** comes from a mesh of :attr:`~nbody_dask.plan.Plan.mesh_size` points a
  side (:mod:`nbody_dask.kernels.pm`): each tile deposits its mass (TSC) on the region of
  the mesh it touches, the partial meshes are added by the plan's fixed reduction tree, one
  task solves Poisson's equation by FFT (``scipy.fft`` on the worker's cores) and each tile
  interpolates its accelerations back with the same weights;
* the **short range** comes from a periodic walk of each near tile's tree, with the cutoff
  (:attr:`~nbody_dask.plan.Plan.cutoff` times ``r_s``; :mod:`nbody_dask.kernels.shortrange`):
  a task per pair of tiles whose bounding boxes come within the cutoff of each other
  (minimum images), found each step from the tiles' extents (fetched, a few numbers a tile).
  The mesh's tasks that need no layout (the deposits and, for a mesh in one piece, the sum,
  the FFT and the interpolations) are submitted with the extents, so that the workers run
  them while the driver fetches the layout and adds the short range's tasks.

With ``layout="rows"`` (one tile per worker) a single task per target tile walks all its
near tiles on the worker's cores, adds its mesh part with the same groups and kicks (the
same bits as ``"pairs"`` on the same tiles): about 5 tasks a tile a step instead of 30.

Tiles are spatial, as the tree's (:mod:`nbody_dask.methods.tree`): re-cut along the Morton
curve at every snapshot step and every ``retile_every`` steps; their trees are built every
step, in the cube of the last re-tiling. A target's partials are its near tiles' walks in
source order, then its mesh part; both depend only on the state, so runs are bit-identical
on any cluster and after a resume. Positions are wrapped into ``[0, L)`` at every drift.

With ``mesh_slabs`` 1 one worker holds the mesh: the FFT is one task, and the solved
fields travel to every tile's interpolation task. With more slabs no task holds the mesh
(:func:`_slab_mesh`), for meshes no worker holds.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import dask.array as da

from .. import meshfft, tasks
from ..graph import (Evaluation, Graph, close_targets, cube_key, reduce_in_order, retile,
                     submit)
from ..plan import Plan, individual_tiles, reduction_groups, tree_tile_size
from ..kernels.pm import overlaps, span_pieces
from ..spatial import tile_extent
from . import ForceMethod, register

__all__ = ["TreePM", "TREEPM", "ShortTrees"]


@dataclass(frozen=True)
class ShortTrees:
    """What the steps after a re-tiling need of it: the cube its trees' keys were taken in
    (later steps build their tiles' trees afresh in it: refitting the old cells to moved
    bodies bloated them, 3.2 s a step against 1.9 s on 20 clumps of 262,144 bodies in 4
    tiles)."""

    cube: object

    def references(self) -> list:
        return [self.cube]

    def rebound(self, references: list) -> ShortTrees:
        return ShortTrees(references[0])


class TreePM(ForceMethod):
    """TreePM in a periodic box (:mod:`nbody_dask.methods.treepm`)."""

    name = "treepm"
    parameters = ("box_size", "mesh_size", "mesh_slabs", "split", "cutoff", "theta",
                  "leaf_size")
    individual_steps = True

    def check(self, plan: Plan) -> None:
        if not plan.periodic:
            raise ValueError("method='treepm' is for periodic boxes: give box_size")
        reach = plan.split * plan.cutoff
        if reach >= plan.mesh_size / 2:
            raise ValueError(f"cutoff * split = {reach:g} mesh cells must be less than half "
                             f"the mesh (mesh_size={plan.mesh_size}): a larger mesh_size or "
                             "a smaller cutoff")

    def tile_size(self, n: int, threads: int, workers: int, layout: str, backend: str) -> int:
        return tree_tile_size(n, threads, workers, layout)

    def settle(self, plan: Plan, threads: int, workers: int, backend: str) -> Plan:
        plan = individual_tiles(plan)
        # the short range on GPUs where every worker has one; "auto" (mixed) walks on CPUs,
        # so that where a task runs does not change its bits
        return super().settle(plan, threads, workers, "cuda" if backend == "cuda" else "cpu")

    def reorders(self, plan: Plan) -> bool:
        return plan.n_tiles > 1

    def synchronised_tiles(self, plan: Plan, dsk: Graph, token: str, step: int,
                           tiles: list) -> list:
        """Spatial tiles re-cut along the Morton curve from the synchronised positions."""
        return retile(dsk, plan, token, step, tiles) if len(tiles) > 1 else tiles

    def tasks_per_step(self, plan: Plan) -> int:
        t = plan.n_tiles
        if plan.fused:
            return 1
        mesh = 2 * t + sum(len(level) for level in plan.groups()) + 1  # deposit, sums, FFT
        moves = t * len(plan.shuffle_blocks())
        retile_tasks = math.ceil((4 * t + moves + 2) / max(1, plan.retile_every))
        near = min(t, 27)  # neighbours of a tile within the cutoff (at most all)
        combines = t * sum(len(level) for level in reduction_groups(near + 1,
                                                                    plan.split_every))
        if plan.layout == "rows":  # drift, tree, bounds, mesh part and row a tile
            return 5 * t + 1 + mesh + retile_tasks
        return 4 * t + 1 + mesh + t * near + combines + retile_tasks

    def describe(self, plan: Plan) -> str:
        tiles = f"{plan.n_tiles} spatial tiles" if plan.n_tiles > 1 else "one tile"
        return (f"forces by TreePM in a periodic box of side {plan.box_size}: mesh "
                f"{plan.mesh_size}^3 (TSC, FFT), split {plan.split} cells, cutoff "
                f"{plan.cutoff} r_s, short-range tree theta={plan.theta}, {tiles}")

    # -- individual time steps: the short range in bins, the mesh on the block -----------------

    def open_block(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                   tiles: list) -> list:
        """Each tile's short-range tree at the block's start; the ticks refit it."""
        trees = [name("bshorttree", i) for i in range(len(tiles))]
        for tree, tile in zip(trees, tiles, strict=True):
            dsk[tree] = (tasks.short_tree, tile, plan.leaf_size, None)
        return trees

    def tick_forces(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                    sources: list[tuple[Any, float]], drifted: dict[int, Any], tick: Any,
                    forces: Any, block: list) -> dict[int, list[str]]:
        """The short range of a tick: every tile's block tree refit to the tick (built
        afresh where every body is synchronised, as a resume builds them) and a periodic
        walk per (active tile, source tile) for the groups with active bodies
        (:func:`~nbody_dask.tasks.active_short_pair_forces`)."""
        periodic = _periodic(plan, tick.threads)
        trees = [name("bshorttick", j) for j in range(len(sources))]
        synchronised = tick.initial or tick.tick == tick.bins.ticks
        for j, (source, drift) in enumerate(sources):
            if synchronised:
                dsk[trees[j]] = (tasks.short_tree, source, plan.leaf_size, None)
            else:
                dsk[trees[j]] = (tasks.drifted_short_tree, block[j], source, drift)
        parts = {}
        for i, target in drifted.items():
            parts[i] = [name("bshort", i, j) for j in range(len(sources))]
            for j, tree in enumerate(trees):
                dsk[parts[i][j]] = (tasks.active_short_pair_forces, target, trees[i], tree,
                                    tick, forces, periodic)
        return parts

    def tick_long_range(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                        drifted: dict[int, Any], tick: Any, forces: Any) -> dict[int, str]:
        """The mesh's forces on every body where all are synchronised: the deposits of
        every tile, the mesh in one task or in slabs (the plan's ``mesh_slabs``; spatial
        tiles only: a one-tile system's blocks run in one task) and an interpolation per
        tile."""
        if not (tick.initial or tick.tick == tick.bins.ticks):
            return {}
        periodic = _periodic(plan, tick.threads)
        tiles = [drifted[i] for i in range(len(drifted))]  # every tile: all are active

        def key(stage: str, *index: int) -> str:
            return name("b" + stage, *index)

        deposits = _deposits(dsk, key, tiles, periodic)
        if plan.mesh_slabs > 1:
            long = _unplanned_slab_mesh(plan, dsk, key, tiles, deposits, periodic,
                                        forces.with_potential)
        else:
            long = _one_task_mesh(plan, dsk, key, tiles, deposits, periodic, tick.threads,
                                  forces.with_potential)
        return dict(enumerate(long))

    def evaluate(self, ev: Evaluation, dsk: Graph, tiles: list, state: ShortTrees | None):
        """A TreePM evaluation at ``ev.step`` (re-tiling first at a re-tiling step or
        without ``state``), yielding a piece to fetch the near tile pairs."""
        plan, t = ev.plan, len(tiles)
        periodic = _periodic(plan, 1 if t > 1 and plan.layout == "pairs" else ev.threads)
        if t == 1:  # one tile: its tree, its own walk, the mesh and the kick
            yield from ()
            trees = [ev.key("tree", 0)]
            dsk[trees[0]] = (tasks.short_tree, tiles[0], plan.leaf_size, None)
            long = _mesh(plan, dsk, ev.key, tiles, _deposits(dsk, ev.key, tiles, periodic),
                         periodic, ev.threads, ev.with_potential)
            return dsk, _short_range(ev, dsk, tiles, trees, [[0]], periodic, long), None
        if state is not None and ev.step not in plan.retile_steps():
            cube = state.cube
        else:
            tiles = retile(dsk, plan, ev.token, ev.step, tiles)
            cube = cube_key(ev.token, ev.step)
        trees = [ev.key("tree", i) for i in range(t)]
        for tree, tile in zip(trees, tiles, strict=True):
            dsk[tree] = (tasks.short_tree, tile, plan.leaf_size, cube)
        extents = [ev.key("bounds", i) for i in range(t)]
        for extent, tile in zip(extents, tiles, strict=True):
            dsk[extent] = (tile_extent, tile)
        dsk[ev.key("layout")] = (tasks.periodic_layout, periodic, *extents)
        # the mesh's tasks that need no layout go with this piece: they run while the
        # driver fetches the layout and builds the short range's tasks
        deposits = _deposits(dsk, ev.key, tiles, periodic)
        long = (_mesh(plan, dsk, ev.key, tiles, deposits, periodic, ev.threads,
                      ev.with_potential) if plan.mesh_slabs == 1 else [])
        refs, (near, spans) = yield from submit(dsk, fetch=ev.key("layout"), tiles=tiles,
                                                trees=trees, cube=[cube], deposits=deposits,
                                                long=long)
        tiles, trees, long = refs["tiles"], refs["trees"], refs["long"]
        if not long:  # the mesh in slabs, submitted before the short range so that the
            # scheduler runs it first (earlier submissions go first) and lets go of its
            # fields as soon as the tiles have interpolated, not after the last walk
            dsk = {}
            long = _mesh(plan, dsk, ev.key, tiles, refs["deposits"], periodic, ev.threads,
                         ev.with_potential, spans)
            long = (yield from submit(dsk, long=long))[0]["long"]
        dsk = {}
        closed = _short_range(ev, dsk, tiles, trees, near, periodic, long)
        return dsk, closed, ShortTrees(refs["cube"][0])


def _periodic(plan: Plan, threads: int | None) -> tasks.Periodic:
    """A plan's TreePM parameters for tasks on ``threads`` kernel threads."""
    return tasks.Periodic(plan.box_size, plan.mesh_size, plan.split_length,
                          plan.cutoff_length, plan.theta, threads, plan.backend)


def _deposits(dsk: Graph, key: Callable[..., str], tiles: list, periodic: tasks.Periodic
              ) -> list[str]:
    """Each tile's partial mesh: the deposits' keys (``key(stage, tile)``)."""
    deposits = [key("deposit", i) for i in range(len(tiles))]
    for deposit, tile in zip(deposits, tiles, strict=True):
        dsk[deposit] = (tasks.mesh_deposit, tile, periodic)
    return deposits


def _mesh(plan: Plan, dsk: Graph, key: Callable[..., str], tiles: list, deposits: list,
          periodic: tasks.Periodic, threads: int | None, with_potential: bool,
          spans: list[tuple[int, int]] | None = None) -> list[str]:
    """The long range from the tiles' deposits, with the potential or not: the mesh in one
    task (an FFT on ``threads``), or in slabs (which need ``spans``, the planes each tile's
    weights touch); each tile's interpolation key (``key(stage, ...)`` names the tasks)."""
    if plan.mesh_slabs > 1 and spans is not None:
        return _slab_mesh(plan, dsk, key, tiles, deposits, spans, periodic, with_potential)
    return _one_task_mesh(plan, dsk, key, tiles, deposits, periodic, threads, with_potential)


def _short_range(ev: Evaluation, dsk: Graph, tiles: list, trees: list, near: list[list[int]],
                 periodic: tasks.Periodic, long: list) -> list[str]:
    """The short-range tasks, a walk per near tile pair, and the closing tasks, each
    tile's long range (``long``) added last."""
    plan, t = ev.plan, len(tiles)
    if plan.layout == "rows":
        out = [ev.key("row", i) for i in range(t)]
        for i in range(t):
            dsk[out[i]] = (tasks.close_short_row, ev.closing, ev.forces, periodic,
                           plan.split_every, tiles[i], trees[i], long[i],
                           *[trees[j] for j in near[i]])
        return out
    parts = []
    for i in range(t):
        parts.append([])
        for j in near[i]:
            parts[i].append((ev.key("short", i, j), None))
            dsk[parts[i][-1][0]] = (tasks.short_pair_forces, trees[i], trees[j], ev.forces,
                                    periodic)
        parts[i].append((long[i], None))
    return close_targets(ev, dsk, tiles, parts,
                         lambda count: reduction_groups(count, plan.split_every))


def _one_task_mesh(plan: Plan, dsk: Graph, key: Callable[..., str], tiles: list,
                   deposits: list[str], periodic: tasks.Periodic, threads: int | None,
                   with_potential: bool) -> list[str]:
    """The mesh in one piece: the deposits added by the plan's reduction tree, one FFT
    task on the worker's threads, an interpolation per tile; the interpolations' keys."""
    meshes = reduce_in_order(dsk, deposits, plan.groups(),
                             lambda level, g: key(f"meshsum{level}", g),
                             tasks.mesh_slab, plan.mesh_size, plan.dtype, 0, plan.mesh_size)
    dsk[key("fft")] = (tasks.mesh_solve, replace(periodic, threads=threads), plan.dtype,
                       with_potential, *meshes)
    out = [key("long", i) for i in range(len(tiles))]
    for name, tile in zip(out, tiles, strict=True):
        dsk[name] = (tasks.mesh_forces, tile, key("fft"), periodic)
    return out


def _slab_mesh(plan: Plan, dsk: Graph, key: Callable[..., str], tiles: list,
               deposits: list[str], spans: list[tuple[int, int]], periodic: tasks.Periodic,
               with_potential: bool) -> list[str]:
    """The mesh in slabs (:attr:`~nbody_dask.plan.Plan.mesh_slabs`): per slab, the deposits
    that reach it added in tile order by the plan's reduction tree; the FFT and the solve
    as a Dask graph of slabs (:mod:`nbody_dask.meshfft`); per tile, an interpolation from
    the planes its weights touch (:func:`~nbody_dask.kernels.pm.span_pieces`): a slab of
    which it reads most, whole; a few planes of another, cut where that slab lies. No task
    holds more than a slab or a tile's region. Submitted before the short range (by the
    caller), so that the scheduler runs it first and lets go of the fields early."""
    n = plan.mesh_size
    bounds = plan.mesh_slab_bounds()
    fields, total_mass = _slab_fields(
        plan, dsk, key, [[deposits[i] for i in range(len(tiles)) if overlaps(spans[i], lo, hi, n)]
                         for lo, hi in bounds], periodic, with_potential)
    out = []
    for i, tile in enumerate(tiles):
        first, count = spans[i]
        # the planes a tile reads: most of a slab, the slab (which travels once to a
        # worker, for all its tiles); a few of its planes, cut where the slab lies (only
        # they travel, not the slab)
        parts, planes, pieces = [], [], span_pieces(bounds, first, count)
        for f, field in enumerate(fields):
            for p, (j, lo, hi) in enumerate(pieces):
                chunk = (field.name, j, 0, 0)
                if 2 * (hi - lo) > bounds[j][1] - bounds[j][0]:
                    parts.append(chunk)
                    planes.append((lo, hi))
                    continue
                parts.append(key("meshplanes", i, f, p))
                planes.append((0, hi - lo))
                dsk[parts[-1]] = (operator.getitem, chunk, slice(lo, hi))
        out.append(key("long", i))
        dsk[out[-1]] = (tasks.mesh_forces_from_slabs, tile, periodic, total_mass, first,
                        len(fields), tuple(planes), *parts)
    return out


def _unplanned_slab_mesh(plan: Plan, dsk: Graph, key: Callable[..., str], tiles: list,
                         deposits: list[str], periodic: tasks.Periodic,
                         with_potential: bool) -> list[str]:
    """:func:`_slab_mesh` where the graph is built before the tiles' planes are known (the
    ticks of individual time steps, which fetch nothing but bin counts): each tile's span
    is a task (:func:`~nbody_dask.tasks.tile_span`); every deposit sends each slab its rows
    there (:func:`~nbody_dask.tasks.region_planes`), every slab of every field each tile
    its planes there (:func:`~nbody_dask.tasks.span_planes`), empty where they miss. Still
    no task holds more than a slab or a tile's region; ``T x slabs`` small tasks more."""
    bounds = plan.mesh_slab_bounds()
    parts = []
    for j, (lo, hi) in enumerate(bounds):
        parts.append([key("slabrows", i, j) for i in range(len(tiles))])
        for part, deposit in zip(parts[-1], deposits, strict=True):
            dsk[part] = (tasks.region_planes, deposit, plan.mesh_size, lo, hi)
    fields, total_mass = _slab_fields(plan, dsk, key, parts, periodic, with_potential)
    out = []
    for i, tile in enumerate(tiles):
        span = key("span", i)
        dsk[span] = (tasks.tile_span, tile, periodic)
        pieces = []
        for f, field in enumerate(fields):
            for j in range(len(bounds)):
                pieces.append(key("spanplanes", i, f, j))
                dsk[pieces[-1]] = (tasks.span_planes, span, (field.name, j, 0, 0), bounds, j)
        out.append(key("long", i))
        dsk[out[-1]] = (tasks.mesh_forces_from_span, tile, periodic, total_mass, span,
                        len(fields), bounds, *pieces)
    return out


def _slab_fields(plan: Plan, dsk: Graph, key: Callable[..., str], parts: list[list[str]],
                 periodic: tasks.Periodic, with_potential: bool) -> tuple[list, Any]:
    """The solved fields as Dask arrays of slabs (their tasks added to ``dsk``) from
    ``parts[j]``, the partial meshes of slab ``j`` added in order by the plan's reduction
    tree; and the total mass (its key; 0 without the potential)."""
    n = plan.mesh_size
    bounds = plan.mesh_slab_bounds()
    name = key("meshslab")
    layer = {}
    for j, ((lo, hi), mine) in enumerate(zip(bounds, parts, strict=True)):
        last = reduce_in_order(dsk, mine, reduction_groups(len(mine), plan.split_every),
                               lambda level, g, j=j: key(f"slabsum{level}", j, g),
                               tasks.mesh_slab, n, plan.dtype, lo, hi)
        layer[(name, j, 0, 0)] = (tasks.mesh_slab, n, plan.dtype, lo, hi, *last)
    mesh = da.Array(layer, name, chunks=(tuple(hi - lo for lo, hi in bounds), (n,), (n,)),
                    dtype=plan.dtype)
    fields = meshfft.long_range(mesh, periodic.box, periodic.split, with_potential, "tsc")
    for field in fields:
        dsk.update(dict(field.__dask_graph__()))
    total_mass: Any = 0.0  # read by the potential alone: without it, no task keeps the slabs
    if with_potential:
        total_mass = key("meshmass")
        dsk[total_mass] = (tasks.mesh_mass, *layer)
    return fields, total_mass


TREEPM = register(TreePM())
