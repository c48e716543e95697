"""A run's task graphs, built from its :class:`~nbody_dask.plan.Plan` as plain dicts.

A graph is a ``dict`` from key to task, a task being a tuple ``(function, *arguments)`` whose
arguments may name other keys of the graph or be :class:`distributed.Future` objects of an
earlier submission (Dask's low-level graph format; the client ships it without walking
objects, so building and submitting a task costs microseconds). Keys are deterministic:
``nbody-<stage>-<token>-<step>-<i>[-<j>]``, where ``token`` identifies the run.

A step (``"pairs"`` layout) is ``T`` drift tasks, the plan's tile-pair tasks, the combine
tasks of the plan's reduction tree and ``T`` kick tasks. With ``"rows"`` it is ``T`` drift
tasks, about ``sqrt(T)`` tasks that gather blocks of drifted positions, and ``T`` row tasks,
each of which runs its row of tile pairs with the parallel kernel and sums them with the
same groups. Partials of a target tile are always summed in source order within fixed
groups, so the result does not depend on the number of workers, the scheduling order,
retries, or the layout: runs are bit-reproducible.

With the tree method (``plan.method == "tree"``) on one tile, a step is a tree task, its walk
and the kick. On spatial tiles (:attr:`~nbody_dask.plan.Plan.spatial`) a step is ``T`` drift
tasks, ``T`` tree tasks, the tile-pair walks, the combine tasks and ``T`` kick tasks. At the
plan's re-tiling steps the drifted tiles are first re-cut along the Morton curve
(:func:`retile`) and their trees built; until the next re-tiling (a *window*) the trees keep
those cells and only follow the bodies (:func:`refit_tree`). Snapshots route the spatial
tiles back to body order before writing.

From ``plan.near_far_tiles`` tiles on (:attr:`~nbody_dask.plan.Plan.near_far`), only near
tile pairs are walked: each tile's tree is summarised (its top cells and its target groups),
the summaries form one forest, and one far task per target tile evaluates all its far tiles
from the forest. Which pairs are near depends on where the bodies are, so such a run's graph
is built in pieces (:func:`initial_pieces`, :func:`steps_pieces`, each a generator of
:data:`Piece`): at a re-tiling the driver fetches the classification for the bodies as they
are (the forces of that step use it), then, from the bodies' largest speed and acceleration
after that step, the classification for the rest of the window, with the opening test
grown by how far a body can move in it. Both depend only on the state at the re-tiling, so
a resumed run (which starts at a snapshot, a re-tiling step) classifies as the uninterrupted
run did. A target's partials are its near sources' walks in source order, then its far task.
With the ``"rows"`` layout there is one tile per worker and a single task per target tile
runs its walks and far task on the worker's cores, sums them in the same groups and kicks:
about ``4 T`` tasks a step instead of ``T`` times the near tiles.

:func:`execute` runs a graph in place, in its insertion order: a one-tile system runs many
steps as one task that way (:func:`fused_steps`), with exactly the operations of the tasks.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .accuracy import (join_targets, pick_targets, reference_partial, sample_targets,
                       sampled_errors)
from .backends import tile_kernels
from .bodies import Tile
from .diagnostics import tile_diagnostics
from .integrators import check_finite, close_step, open_step
from .plan import Plan, reduction_groups
from .location import StoreLocation
from .spatial import (bounding_cube, cut_by_chunk, cut_by_splitters, key_sample, merge_by_id,
                      merge_parts, sample_stride, splitters, tile_extent)
from .storage import write_tile

__all__ = ["Graph", "Piece", "TreeWindow", "key", "pair_forces", "symmetric_pair_forces",
           "self_forces", "gather_sources", "row_forces", "tile_tree", "tree_pair_forces",
           "refit_tree", "tree_summary", "tree_forest", "near_now", "tile_motion",
           "near_in_window", "far_forces", "close_tree_row", "retile", "merge_picked",
           "body_order", "sum_in_order", "sum_sides", "initial_graph", "steps_graph",
           "initial_pieces", "steps_pieces", "snapshot_graph", "fused_steps", "execute"]

Graph = dict[str, tuple]


def key(token: str, stage: str, step: int, *index: int) -> str:
    """The key of a task: ``nbody-<stage>-<token>-<step>-<i>[-<j>]``."""
    return "-".join(["nbody", stage, token, str(step), *map(str, index)])


# -- task functions (run on the workers) ------------------------------------------------------

def _eps2(tile: Tile, softening: float):
    """Squared softening in the tile's dtype (no float64 enters a float32 kernel)."""
    ftype = tile.position.dtype.type
    return ftype(softening) * ftype(softening)


def pair_forces(target: Tile, source: Tile, softening: float, with_potential: bool,
                backend: str = "cpu") -> np.ndarray:
    """Partial forces (G = 1) on ``target`` due to ``source``; one kernel call.

    Returns an array of shape (3, n_target), or (4, n_target) with the potential in row 3.
    """
    kernels = tile_kernels(backend)
    eps2 = _eps2(target, softening)
    return kernels.tile_pair_forces(target.position, source.position, source.mass, eps2,
                                    with_potential, target.start == source.start)


def symmetric_pair_forces(target: Tile, source: Tile, softening: float,
                          with_potential: bool) -> tuple[np.ndarray, np.ndarray]:
    """Partial forces (G = 1) on both tiles of a pair of distinct tiles; one CPU kernel call."""
    from .kernels import cpu

    eps2 = _eps2(target, softening)
    return cpu.symmetric_pair_forces(target.position, target.mass, source.position,
                                     source.mass, eps2, with_potential)


def self_forces(tile: Tile, softening: float, with_potential: bool) -> np.ndarray:
    """Partial forces (G = 1) of a tile on itself, each pair once; one CPU kernel call."""
    from .kernels import cpu

    eps2 = _eps2(tile, softening)
    return cpu.self_tile_forces(tile.position, tile.mass, eps2, with_potential)


def gather_sources(*tiles: Tile) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Positions (3, n) and masses of consecutive tiles in one block, and the tiles' sizes."""
    return (np.concatenate([t.position for t in tiles], axis=1),
            np.concatenate([t.mass for t in tiles]), [t.size for t in tiles])


def row_forces(target: int, own: Tile, blocks: Sequence[tuple], softening: float,
               with_potential: bool, threads: int | None = None) -> list[np.ndarray]:
    """Partial forces (G = 1) on tile ``own`` (number ``target``) due to every tile, with the
    parallel kernel; ``blocks`` are :func:`gather_sources` of all tiles, in order.

    Entry ``j`` is bit-identical to :func:`pair_forces` of ``(own, tile j)`` on the CPU, for
    any number of ``threads`` (None: every core).
    """
    from .kernels import rows

    position = np.concatenate([b[0] for b in blocks], axis=1)
    mass = np.concatenate([b[1] for b in blocks])
    starts = np.cumsum([0] + [size for b in blocks for size in b[2]], dtype=np.int64)
    rows.set_threads(threads)
    out = rows.row_forces(*own.position, *position, mass, starts, _eps2(own, softening),
                          with_potential, target)
    return list(out)


def tile_tree(tile: Tile, leaf_size: int, cube: np.ndarray | None = None):
    """The tile's octree and moments (:class:`~nbody_dask.kernels.tree.TileTree`), its keys
    in the ``cube`` of all tiles (:func:`~nbody_dask.spatial.bounding_cube`; None: the
    tile's own)."""
    from .kernels import tree

    return tree.build(tile.position, tile.mass, leaf_size, cube)


def tree_pair_forces(target, source, softening: float, theta: float, with_potential: bool,
                     same: bool, threads: int | None) -> np.ndarray:
    """Partial forces (G = 1) on tile tree ``target`` due to tile tree ``source``: one group
    walk per target leaf (3 or 4 rows, in the target tile's order), on ``threads`` Numba
    threads of this task (None: every core; the result does not depend on them)."""
    from .kernels import rows, tree

    ftype = target.x.dtype.type
    rows.set_threads(threads)
    return tree.walk(target, source, ftype(softening) * ftype(softening), theta,
                     with_potential, same)


def refit_tree(tree, tile: Tile):
    """The tile's tree at its new positions, with the cells of ``tree`` (built at the last
    re-tiling from the same bodies, :func:`~nbody_dask.kernels.tree.refit`)."""
    from .kernels import tree as trees

    return trees.refit(tree, tile.position, tile.mass)


def tree_summary(tree):
    """The tile tree's top cells and target groups (:class:`~nbody_dask.kernels.tree.
    Summary`): what the other tiles need of it."""
    from .kernels import tree as trees

    return trees.summarize(tree)


def tree_forest(*summaries):
    """All tiles' summaries in one :class:`~nbody_dask.kernels.tree.Forest`, in tile
    order."""
    from .kernels import tree as trees

    return trees.forest(*summaries)


def near_now(forest, theta: float) -> list[list[int]]:
    """Each target tile's near source tiles for the positions the forest was built from."""
    from .kernels import tree as trees

    return trees.near_sources(forest, theta)


def tile_motion(tile: Tile) -> np.ndarray:
    """The tile's largest speed and acceleration, float64."""
    def largest(v: np.ndarray) -> float:
        return float(np.sqrt((v.astype(np.float64) ** 2).sum(axis=0)).max(initial=0.0))

    return np.array([largest(tile.velocity), largest(tile.acceleration)])


def near_in_window(forest, theta: float, duration: float, *motions: np.ndarray
                   ) -> list[list[int]]:
    """Each target tile's near source tiles for the next ``duration`` of time: the forest's
    test is grown by how far a body can move in it, from the tiles' ``motions``
    (:func:`tile_motion`)."""
    from .kernels import tree as trees

    speed, acceleration = np.max(motions, axis=0)
    return trees.near_sources(forest, theta,
                              trees.displacement_bound(speed, acceleration, duration))


def far_forces(step: int, target, forest, far: list[int], softening: float, theta: float,
               with_potential: bool, threads: int | None) -> np.ndarray:
    """Partial forces (G = 1) on tile tree ``target`` due to the tiles ``far``, from their
    summaries in ``forest`` (:func:`~nbody_dask.kernels.tree.far_walk`); its
    :class:`~nbody_dask.kernels.tree.FarFieldError` names ``step``."""
    from .kernels import rows, tree as trees

    ftype = target.x.dtype.type
    rows.set_threads(threads)
    try:
        return trees.far_walk(target, forest, np.array(far, dtype=np.int64),
                              ftype(softening) * ftype(softening), theta, with_potential)
    except trees.FarFieldError as exc:
        raise trees.FarFieldError(f"step {step}: {exc}", step) from None


def sum_in_order(*parts: np.ndarray) -> np.ndarray:
    """Sum arrays left to right (a fixed order, hence a reproducible rounding)."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def sum_sides(sides: Sequence, *parts) -> np.ndarray:
    """:func:`sum_in_order` of partial forces, where ``parts[k]`` is an array when
    ``sides[k]`` is None and the ``(on_target, on_source)`` result of a symmetric pair task,
    of which side ``sides[k]`` is wanted, otherwise."""
    return sum_in_order(*(p if side is None else p[side]
                          for p, side in zip(parts, sides, strict=True)))


def reduce_in_groups(parts: list, groups: list[list[tuple[int, int]]]) -> np.ndarray:
    """Sum partial forces with a plan's reduction tree, as the combine tasks would."""
    for level in groups:
        parts = [sum_in_order(*parts[lo:hi]) for lo, hi in level]
    return sum_in_order(*parts)


def close(step: int, tile: Tile, G: float, dt: float | None, sides: Sequence, *parts) -> Tile:
    """Sum the last partials, attach the forces, kick, and check the state is finite."""
    return check_finite(close_step(tile, sum_sides(sides, *parts), G, dt), step)


def close_row(step: int, target: int, G: float, dt: float | None, softening: float,
              with_potential: bool, groups: list, threads: int | None, own: Tile,
              *blocks: tuple) -> Tile:
    """The ``"rows"`` layout's task: a target tile's whole row of forces, summed and kicked."""
    parts = row_forces(target, own, blocks, softening, with_potential, threads)
    forces = reduce_in_groups(parts, groups)
    return check_finite(close_step(own, forces, G, dt), step)


def close_tree_row(step: int, target: int, G: float, dt: float | None, softening: float,
                   theta: float, with_potential: bool, split_every: int, threads: int | None,
                   tile: Tile, tree, near: list[int], far: list[int], forest,
                   *near_trees) -> Tile:
    """The ``"rows"`` layout's tree task: tile ``target``'s walks of its ``near`` tiles (their
    ``near_trees``, in source order) and of its ``far`` tiles' summaries in ``forest``, on
    ``threads`` (None: every core), summed with the fixed groups that the ``"pairs"``
    layout's combine tasks use (so the two layouts give the same bits), and the kick."""
    parts = [tree_pair_forces(tree, source, softening, theta, with_potential, j == target,
                              threads) for j, source in zip(near, near_trees, strict=True)]
    if far:
        parts.append(far_forces(step, tree, forest, far, softening, theta, with_potential,
                                threads))
    forces = reduce_in_groups(parts, reduction_groups(len(parts), split_every))
    return check_finite(close_step(tile, forces, G, dt), step)


def write_and_measure(path: StoreLocation | None, index: int, tile: Tile, G: float, run: str,
                      writer: str) -> np.ndarray:
    """Write a tile's region of snapshot ``index`` (unless ``path`` is None); its diagnostics."""
    if path is not None:
        write_tile(path, index, tile, run, writer)
    return tile_diagnostics(tile, G)


# -- graph construction (in the driver) ------------------------------------------------------

def _forces(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence,
            with_potential: bool, dt: float | None, threads: int | None) -> list[str]:
    """Add the force tasks of one evaluation on ``tiles`` (keys or futures at one time) and
    the closing tasks; return the keys of the closed tiles."""
    t = len(tiles)
    if plan.method == "tree":  # one tile: a tree, its walk and the kick
        return _tree_forces(dsk, plan, token, step, tiles, _trees(dsk, plan, token, step, tiles),
                            None, None, with_potential, dt, threads)
    if plan.layout == "rows":
        groups, blocks = plan.groups(), []
        for b, (lo, hi) in enumerate(plan.source_blocks()):
            blocks.append(key(token, "sources", step, b))
            dsk[blocks[-1]] = (gather_sources, *tiles[lo:hi])
        out = [key(token, "row", step, i) for i in range(t)]
        for i in range(t):
            dsk[out[i]] = (close_row, step, i, plan.G, dt, plan.softening, with_potential,
                           groups, threads, tiles[i], *blocks)
        return out
    for i, j in plan.pair_tasks():
        if not plan.symmetric:
            dsk[key(token, "pair", step, i, j)] = (pair_forces, tiles[i], tiles[j],
                                                   plan.softening, with_potential,
                                                   plan.backend)
        elif i == j:
            dsk[key(token, "pair", step, i, j)] = (self_forces, tiles[i], plan.softening,
                                                   with_potential)
        else:
            dsk[key(token, "pair", step, i, j)] = (symmetric_pair_forces, tiles[i], tiles[j],
                                                   plan.softening, with_potential)
    return _close_rows(dsk, plan, token, step, tiles, dt)


def _close_rows(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence,
                dt: float | None) -> list[str]:
    """Add the combine and kick tasks of every target tile over the step's pair tasks."""
    out, groups = [], plan.groups()
    for i in range(len(tiles)):
        parts = [(key(token, "pair", step, *pair), side) for pair, side in plan.parts(i)]
        parts = _combine(dsk, parts, groups,
                         lambda level, g, i=i: key(token, f"combine{level}", step, i, g))
        out.append(key(token, "kick", step, i))
        dsk[out[-1]] = (close, step, tiles[i], plan.G, dt, [s for _, s in parts],
                        *[p for p, _ in parts])
    return out


def _tree_forces(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence,
                 trees: Sequence, near: list[list[int]] | None, forest: Any,
                 with_potential: bool, dt: float | None, threads: int | None) -> list[str]:
    """The tree method's force tasks on ``tiles`` and their ``trees``: a walk per near tile
    pair (every pair when ``near`` is None), one far task per target tile with far sources
    (from ``forest``, added here when None), the closing tasks. A walk uses one thread in
    the ``"pairs"`` layout with several tiles (the worker's threads run many walks), the
    worker's cores otherwise. A target's partials are summed near sources first, in source
    order, then the far task's. With ``"rows"``, one task per target tile does all of that
    (:func:`close_tree_row`)."""
    t = len(tiles)
    if plan.layout == "pairs" and t > 1:
        threads = 1
    name = functools.partial(key, token)
    near = near or [list(range(t))] * t
    if forest is None and any(len(row) < t for row in near):
        forest = _forest(dsk, plan, token, step, trees)
    out, split = [], plan.split_every
    if plan.layout == "rows":
        for i in range(t):
            walked = set(near[i])
            out.append(name("row", step, i))
            dsk[out[-1]] = (close_tree_row, step, i, plan.G, dt, plan.softening, plan.theta,
                            with_potential, split, threads, tiles[i], trees[i], near[i],
                            [j for j in range(t) if j not in walked], forest,
                            *[trees[j] for j in near[i]])
        return out
    for i in range(t):
        parts = []
        for j in near[i]:
            parts.append((name("pair", step, i, j), None))
            dsk[parts[-1][0]] = (tree_pair_forces, trees[i], trees[j], plan.softening,
                                 plan.theta, with_potential, i == j, threads)
        walked = set(near[i])
        far = [j for j in range(t) if j not in walked]
        if far:
            parts.append((name("far", step, i), None))
            dsk[parts[-1][0]] = (far_forces, step, trees[i], forest, far, plan.softening,
                                 plan.theta, with_potential, threads)
        parts = _combine(dsk, parts, reduction_groups(len(parts), split),
                         lambda level, g, i=i: name(f"combine{level}", step, i, g))
        out.append(name("kick", step, i))
        dsk[out[-1]] = (close, step, tiles[i], plan.G, dt, [s for _, s in parts],
                        *[p for p, _ in parts])
    return out


def _trees(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence,
           cube: str | None = None) -> list[str]:
    """Add a task building each tile's tree (:func:`tile_tree`) in ``cube`` (the key of a
    re-tiling's cube; None: one tile, in its own); return their keys."""
    trees = [key(token, "tree", step, i) for i in range(len(tiles))]
    for tree, tile in zip(trees, tiles, strict=True):
        dsk[tree] = (tile_tree, tile, plan.leaf_size, cube)
    return trees


def _forest(dsk: Graph, plan: Plan, token: str, step: int, trees: Sequence) -> str:
    """Add a summary task per tile tree and the forest of them; return the forest's key."""
    name = functools.partial(key, token)
    summaries = [name("summary", step, i) for i in range(len(trees))]
    for summary, tree in zip(summaries, trees, strict=True):
        dsk[summary] = (tree_summary, tree)
    dsk[name("forest", step)] = (tree_forest, *summaries)
    return name("forest", step)


@dataclass(frozen=True)
class TreeWindow:
    """What the steps after a re-tiling of a spatial tree run need of it, until the next:
    the tile trees built there (later steps keep their cells, :func:`refit_tree`) and each
    target tile's near source tiles (None: every tile)."""

    trees: list
    near: list[list[int]] | None


#: A piece of a graph built in parts: ``(graph, wanted, fetched)``: the driver submits
#: ``graph``, and sends back the futures of ``wanted`` (keys, or futures passed through) and
#: the values of its first ``fetched``.
Piece = tuple[Graph, list, int]


def _submit(dsk: Graph, wanted: list, fetched: int):
    """Yield a :data:`Piece`; return the driver's ``(futures, values)``."""
    return (yield dsk, wanted, fetched)


def _tree_step(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence,
               window: TreeWindow | None, with_potential: bool, dt: float | None,
               threads: int | None, walk_all: frozenset):
    """Add a spatial tree evaluation at ``step`` to ``dsk`` (re-tiling first at a re-tiling
    step or without a ``window``), yielding pieces where the near/far classification must
    be fetched; return the graph left to submit, the closed tiles and the window. Windows
    that start at a step of ``walk_all`` walk every pair after their first step."""
    t, name = len(tiles), functools.partial(key, token)
    if window is not None and step not in plan.retile_steps():
        trees = [name("tree", step, i) for i in range(t)]
        for i in range(t):
            dsk[trees[i]] = (refit_tree, window.trees[i], tiles[i])
        return dsk, _tree_forces(dsk, plan, token, step, tiles, trees, window.near, None,
                                 with_potential, dt, threads), window
    tiles = retile(dsk, plan, token, step, tiles)
    trees = _trees(dsk, plan, token, step, tiles, _cube_key(token, step))
    if not plan.near_far:
        return dsk, _tree_forces(dsk, plan, token, step, tiles, trees, None, None,
                                 with_potential, dt, threads), TreeWindow(trees, None)
    # near/far for the positions of this step: fetched before its forces are submitted
    forest = _forest(dsk, plan, token, step, trees)
    dsk[name("near", step)] = (near_now, forest, plan.theta)
    refs, (near,) = yield from _submit(dsk, [name("near", step), *tiles, *trees, forest], 1)
    tiles, trees, forest, dsk = refs[1:t + 1], refs[t + 1:2 * t + 1], refs[-1], {}
    closed = _tree_forces(dsk, plan, token, step, tiles, trees, near, forest, with_potential,
                          dt, threads)
    last = plan.window_end(step)
    if step in walk_all:  # bodies outran this window's margin once: walk every pair
        return dsk, closed, TreeWindow(trees, None)
    if last == step or all(len(row) == t for row in near):
        return dsk, closed, TreeWindow(trees, near)  # (a longer window only adds near pairs)
    # near/far until the next re-tiling, from how far the bodies can move from here
    motions = [name("motion", step, i) for i in range(t)]
    for motion, tile in zip(motions, closed, strict=True):
        dsk[motion] = (tile_motion, tile)
    dsk[name("nearwindow", step)] = (near_in_window, forest, plan.theta,
                                     (last - step) * plan.dt, *motions)
    refs, (near,) = yield from _submit(dsk, [name("nearwindow", step), *closed, *trees], 1)
    return {}, refs[1:t + 1], TreeWindow(refs[t + 1:], near)


def _finish(dsk: Graph, tiles: list, window: TreeWindow | None):
    """Submit what is left of ``dsk`` (if anything); return the tiles' and the window's
    futures."""
    if not dsk:
        return tiles, window
    trees = [] if window is None else window.trees
    refs, _ = yield from _submit(dsk, [*tiles, *trees], 0)
    t = len(tiles)
    return refs[:t], window and TreeWindow(refs[t:], window.near)


def initial_pieces(plan: Plan, token: str, tiles: Sequence, with_potential: bool = True,
                   threads: int | None = None, step: int = 0,
                   walk_all: frozenset = frozenset()):
    """Generator of the :data:`Piece` s that attach forces (and potentials) to the initial
    ``tiles`` (at ``step``: 0, or a resumed snapshot's step; no kick); returns the futures
    of the closed tiles and the :class:`TreeWindow` (None unless the plan has spatial
    tiles). ``walk_all``: windows (by first step) whose far tasks once failed
    (:class:`~nbody_dask.kernels.tree.FarFieldError`): every pair is walked there."""
    if not plan.spatial:
        dsk, keys = initial_graph(plan, token, tiles, with_potential, threads)
        return (yield from _finish(dsk, keys, None))
    dsk, tiles, window = yield from _tree_step({}, plan, token, step, tiles, None,
                                               with_potential, None, threads, walk_all)
    return (yield from _finish(dsk, tiles, window))


def steps_pieces(plan: Plan, token: str, tiles: Sequence, window: TreeWindow | None,
                 first: int, last: int, potential_steps: frozenset,
                 threads: int | None = None, walk_all: frozenset = frozenset()):
    """Generator of the :data:`Piece` s of steps ``first..last`` from ``tiles`` (futures of
    the state after step ``first - 1``) and the window that state was computed in; returns
    the futures of the tiles after step ``last`` and the new window (``walk_all``: see
    :func:`initial_pieces`)."""
    if not plan.spatial:
        dsk, keys = steps_graph(plan, token, tiles, first, last, potential_steps, threads)
        return (yield from _finish(dsk, keys, None))
    dsk: Graph = {}
    for step in range(first, last + 1):
        drifted = [key(token, "drift", step, i) for i in range(len(tiles))]
        for name, tile in zip(drifted, tiles, strict=True):
            dsk[name] = (open_step, tile, plan.dt)
        dsk, tiles, window = yield from _tree_step(dsk, plan, token, step, drifted, window,
                                                   step in potential_steps, plan.dt, threads,
                                                   walk_all)
    return (yield from _finish(dsk, tiles, window))


def _cube_key(token: str, step: int) -> str:
    """The key of the re-tiling's cube at ``step``: the Morton curve's and the trees'."""
    return key(token, "cube", step)


def retile(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence) -> list[str]:
    """Add the tasks that re-cut ``tiles`` into spatial tiles along the Morton curve
    (:mod:`nbody_dask.spatial`); return the keys of the new tiles.

    ``T`` extents, one cube, ``T`` key samples, one splitter task, ``T`` cuts, ``T x B``
    parts (:meth:`~nbody_dask.plan.Plan.shuffle_blocks`) and ``T`` merges: no task holds
    more than one block of tiles' bodies.
    """
    t = len(tiles)
    name = functools.partial(key, token)
    extents = [name("extent", step, i) for i in range(t)]
    samples = [name("sample", step, i) for i in range(t)]
    cuts = [name("cut", step, i) for i in range(t)]
    cube, split = _cube_key(token, step), name("splitters", step)
    stride = sample_stride(plan.n, t)
    for i, tile in enumerate(tiles):
        dsk[extents[i]] = (tile_extent, tile)
    dsk[cube] = (bounding_cube, *extents)
    for i, tile in enumerate(tiles):
        dsk[samples[i]] = (key_sample, tile, cube, stride)
    dsk[split] = (splitters, t, *samples)
    for i, tile in enumerate(tiles):
        dsk[cuts[i]] = (cut_by_splitters, tile, cube, split)
    return _move(dsk, plan, token, "spatial", step, cuts, merge_parts, [[]] * t)


def merge_picked(offset: int, merge, head: list, *blocks: list) -> Tile:
    """``merge(*head, *parts)``, the parts being entry ``offset`` of each block of parts."""
    return merge(*head, *(block[offset] for block in blocks))


def _move(dsk: Graph, plan: Plan, token: str, stage: str, step: int, cuts: Sequence,
          merge, heads: list[list]) -> list[str]:
    """Add the tasks that move bodies from old tiles to new ones: ``cuts[i]`` (a task's key)
    is old tile ``i`` cut into one part per new tile, new tile ``k`` is ``merge(*heads[k],
    *parts)`` over its parts in old-tile order. The parts are taken in blocks of consecutive
    new tiles (:meth:`~nbody_dask.plan.Plan.shuffle_blocks`); return the new tiles' keys."""
    name = functools.partial(key, token)
    out = []
    for b, (lo, hi) in enumerate(plan.shuffle_blocks()):
        blocks = [name(f"{stage}part", step, i, b) for i in range(len(cuts))]
        for block, cut in zip(blocks, cuts, strict=True):
            dsk[block] = (operator.getitem, cut, slice(lo, hi))
        for new in range(lo, hi):
            out.append(name(stage, step, new))
            dsk[out[-1]] = (merge_picked, new - lo, merge, heads[new], *blocks)
    return out


def body_order(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence) -> list[str]:
    """Add the tasks that route spatial ``tiles`` back to body order, in the plan's tile
    bounds (the store's chunks); return their keys. Without spatial tiles: ``tiles``."""
    if not plan.spatial:
        return list(tiles)
    bounds = plan.tile_bounds()
    name = functools.partial(key, token)
    cuts = [name("bycut", step, i) for i in range(len(tiles))]
    for i, tile in enumerate(tiles):
        dsk[cuts[i]] = (cut_by_chunk, tile, plan.tile_size, len(bounds))
    return _move(dsk, plan, token, "bodyorder", step, cuts, merge_by_id,
                 [[lo] for lo, _ in bounds])


def _combine(dsk: Graph, parts: list[tuple[str, int | None]], groups: list,
             name) -> list[tuple[str, int | None]]:
    """Add the combine tasks of the reduction tree ``groups`` over ``parts`` (``(key, side)``
    pairs, see :func:`sum_sides`), task ``g`` of level ``l`` keyed ``name(l, g)``; return the
    at most ``split_every`` parts left for the consumer to add."""
    for level, ranges in enumerate(groups):
        combined = []
        for g, (lo, hi) in enumerate(ranges):
            combined.append((name(level, g), None))
            dsk[combined[-1][0]] = (sum_sides, [s for _, s in parts[lo:hi]],
                                    *[p for p, _ in parts[lo:hi]])
        parts = combined
    return parts


def _check_whole(plan: Plan) -> None:
    if plan.spatial:
        raise ValueError("a plan with spatial tiles is built in pieces: see initial_pieces "
                         "and steps_pieces")


def initial_graph(plan: Plan, token: str, tiles: Sequence, with_potential: bool = True,
                  threads: int | None = None) -> tuple[Graph, list[str]]:
    """Attach forces (and potentials) to the initial ``tiles``: step 0, no kick (plans
    without spatial tiles; see :func:`initial_pieces`)."""
    _check_whole(plan)
    dsk: Graph = {}
    return dsk, _forces(dsk, plan, token, 0, tiles, with_potential, None, threads)


def steps_graph(plan: Plan, token: str, tiles: Sequence, first: int, last: int,
                potential_steps: frozenset, threads: int | None = None
                ) -> tuple[Graph, list[str]]:
    """Leapfrog steps ``first..last`` from ``tiles`` (the state after step ``first - 1``),
    for plans without spatial tiles (see :func:`steps_pieces`).

    Returns the graph and the keys of the tiles after step ``last``; potentials are computed
    on ``potential_steps`` (snapshot steps).
    """
    _check_whole(plan)
    dsk: Graph = {}
    for step in range(first, last + 1):
        drifted = [key(token, "drift", step, i) for i in range(len(tiles))]
        for name, tile in zip(drifted, tiles, strict=True):
            dsk[name] = (open_step, tile, plan.dt)
        tiles = _forces(dsk, plan, token, step, drifted, step in potential_steps, plan.dt,
                        threads)
    return dsk, list(tiles)


def fused_steps(tile: Tile, plan: Plan, token: str, first: int, last: int,
                potential_steps: frozenset, threads: int | None = None) -> Tile:
    """Steps ``first..last`` of a one-tile system in one task, exactly as the task graph."""
    dsk, (out,) = steps_graph(plan, token, ["input"], first, last, potential_steps, threads)
    return execute(dsk, out, {"input": tile})


def snapshot_graph(plan: Plan, token: str, tiles: Sequence, step: int,
                   path: StoreLocation | None,
                   index: int, writer: str = "") -> tuple[Graph, str]:
    """Write snapshot ``index`` from the workers and reduce its diagnostics in fixed order.

    Each tile's task writes its own region of the store (whole chunks; skipped when ``path``
    is None) and returns the tile's float64 diagnostics; these are summed over tiles with the
    plan's reduction tree. The result is ready only once every region is on disk. ``writer``
    is the run's lease id (:mod:`nbody_dask.lease`), checked before each write.
    """
    dsk: Graph = {}
    tiles = body_order(dsk, plan, token, step, tiles)
    parts = [(key(token, "snapshot", step, i), None) for i in range(len(tiles))]
    for (name, _), tile in zip(parts, tiles, strict=True):
        dsk[name] = (write_and_measure, path, index, tile, plan.G, token, writer)
    parts = _combine(dsk, parts, plan.groups(),
                     lambda level, g: key(token, f"diagcombine{level}", step, g))
    total = key(token, "diagnostics", step)
    dsk[total] = (sum_in_order, *[p for p, _ in parts])
    if plan.force_error_sample:
        errors = _sampled_force_errors(dsk, plan, token, step, tiles)
        dsk[key(token, "diagerrors", step)] = (_append, total, errors)
        total = key(token, "diagerrors", step)
    return dsk, total


def _sampled_force_errors(dsk: Graph, plan: Plan, token: str, step: int,
                          tiles: Sequence) -> str:
    """Add the tasks that measure the force errors of the plan's sampled bodies in body-order
    ``tiles`` against a float64 direct sum (each tile adds its part, summed in tile order);
    return the key of their ``[median, p99, max]``."""
    name = functools.partial(key, token)
    targets = _error_targets(plan.n, plan.force_error_sample)
    picks = [name("errpick", step, i) for i in range(len(tiles))]
    for pick, tile in zip(picks, tiles, strict=True):
        dsk[pick] = (pick_targets, tile, targets)
    joined = name("errtargets", step)
    dsk[joined] = (join_targets, *picks)
    partials = [name("errpart", step, i) for i in range(len(tiles))]
    for part, tile in zip(partials, tiles, strict=True):
        dsk[part] = (reference_partial, joined, tile, plan.softening)
    dsk[name("errref", step)] = (sum_in_order, *partials)
    dsk[name("errstats", step)] = (sampled_errors, joined, plan.G, name("errref", step))
    return name("errstats", step)


@functools.lru_cache(maxsize=4)
def _error_targets(n: int, sample: int) -> np.ndarray:
    """The bodies whose force errors every snapshot of a run records (always the same)."""
    return sample_targets(n, sample, seed=0)


def _append(diagnostics: np.ndarray, errors: np.ndarray) -> np.ndarray:
    return np.concatenate([diagnostics, errors])


def execute(dsk: Graph, out: str, inputs: dict[str, Any]) -> Any:
    """Run a graph in this thread, in insertion order (dependencies come first)."""
    values = dict(inputs)

    def resolve(arg: Any) -> Any:
        return values[arg] if isinstance(arg, str) and arg in values else arg

    for name, (func, *args) in dsk.items():
        values[name] = func(*map(resolve, args))
    return values[out]
