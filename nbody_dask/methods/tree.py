"""The tree: an octree with quadrupole moments per tile, a group walk per tile pair.

On one tile (:attr:`~nbody_dask.plan.Plan.spatial` false) a step is a tree task, its walk on
all the worker's cores and the kick. On spatial tiles a step is, besides the drifts, a tree
task per tile, the tile-pair walks, the combine tasks and a kick per tile. At the plan's
re-tiling steps (:meth:`~nbody_dask.plan.Plan.retile_steps`) the drifted tiles are first
re-cut along the Morton curve (:func:`retile`, :mod:`nbody_dask.spatial`) and their trees
built in the cube of all the bodies; until the next re-tiling (a *window*) the trees keep
those cells and only follow the bodies (:func:`~nbody_dask.tasks.refit_tree`). Snapshots
route the spatial tiles back to body order.

From ``plan.near_far_tiles`` tiles on (:attr:`~nbody_dask.plan.Plan.near_far`), only near
tile pairs are walked: each tile's tree is summarised (its top cells and its target groups),
the summaries form one forest, and one far task per target tile evaluates all its far tiles
from the forest. Which pairs are near depends on where the bodies are: at a re-tiling the
graph fetches the classification for the bodies as they are (the forces of that step use
it), then, from the bodies' largest speed and acceleration after that step, the
classification for the rest of the window, with the opening test grown by how far a body can
move in it. Both depend only on the state at the re-tiling, so a resumed run (which starts
at a snapshot, a re-tiling step) classifies as the uninterrupted run did. A target's
partials are its near sources' walks in source order, then its far task. Should bodies still
outrun the margin (:class:`~nbody_dask.kernels.tree.FarFieldError`), the driver re-runs the
window from the last snapshot walking every pair (the fallback). With the ``"rows"`` layout
there is one tile per worker and a single task per target tile runs its walks and far task
on the worker's cores, sums them in the same groups and kicks: about ``4 T`` tasks a step
instead of ``T`` times the near tiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import tasks
from ..graph import Evaluation, Graph, close_targets, cube_key, retile, submit
from ..kernels.farfield import FarFieldError
from ..plan import TREE_ONE_TILE_MAX, Plan, individual_tiles, reduction_groups, tree_tile_size
from . import ForceMethod, register

__all__ = ["Tree", "TREE", "TreeWindow", "tree_tile_size", "TREE_ONE_TILE_MAX"]


@dataclass(frozen=True)
class TreeWindow:
    """What the steps after a re-tiling of spatial tiles need of it, until the next: the
    tile trees built there (later steps keep their cells) and each target tile's near
    source tiles (None: every tile)."""

    trees: list
    near: list[list[int]] | None

    def references(self) -> list:
        return list(self.trees)

    def rebound(self, references: list) -> TreeWindow:
        return TreeWindow(list(references), self.near)


class Tree(ForceMethod):
    """The octree method (:mod:`nbody_dask.methods.tree`)."""

    name = "tree"
    parameters = ("theta", "leaf_size")
    fallback_errors = (FarFieldError,)
    individual_steps = True

    def check(self, plan: Plan) -> None:
        if plan.periodic:
            raise ValueError("method='tree' is for isolated systems; in a periodic box "
                             "(box_size) use method='treepm' or 'direct' (Ewald sums)")
        if plan.backend == "cuda":
            raise ValueError("method='tree' runs on CPUs; backend='cuda' needs "
                             "method='direct'")

    def tile_size(self, n: int, threads: int, workers: int, layout: str, backend: str) -> int:
        return tree_tile_size(n, threads, workers, layout)

    def settle(self, plan: Plan, threads: int, workers: int, backend: str) -> Plan:
        return super().settle(individual_tiles(plan), threads, workers, "cpu")

    def reorders(self, plan: Plan) -> bool:
        # spatial tiles, re-cut along the Morton curve
        return plan.n_tiles > 1

    def synchronised_tiles(self, plan: Plan, dsk: Graph, token: str, step: int,
                           tiles: list) -> list:
        """Spatial tiles re-cut along the Morton curve from the synchronised positions."""
        return retile(dsk, plan, token, step, tiles) if len(tiles) > 1 else tiles

    def tasks_per_step(self, plan: Plan) -> int:
        t = plan.n_tiles
        if plan.fused:
            return 1
        combines = sum(len(level) for level in plan.groups()) * t
        # trees, and a re-tiling's 4 T + T B + 2 now and then
        moves = t * len(plan.shuffle_blocks())
        retile_tasks = math.ceil((4 * t + moves + 2) / max(1, plan.retile_every))
        if plan.layout == "rows":  # drift, tree, row; summaries and forest
            return 3 * t + (t + 1 if plan.near_far else 0) + retile_tasks
        far = 2 * t + 1 if plan.near_far else 0  # summaries, forest, far tasks
        return 3 * t + far + t * t + combines + retile_tasks

    def describe(self, plan: Plan) -> str:
        tiles = f"{plan.n_tiles} spatial tiles" if plan.n_tiles > 1 else "one tile"
        if plan.near_far:
            tiles += " (far tile pairs from tree summaries)"
        return f"forces by the tree, theta={plan.theta}, leaf_size={plan.leaf_size}, {tiles}"

    def open_block(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                   tiles: list) -> list:
        """Each tile's tree at the block's start; the ticks refit it to their positions."""
        trees = [name("btree", i) for i in range(len(tiles))]
        for tree, tile in zip(trees, tiles, strict=True):
            dsk[tree] = (tasks.tile_tree, tile, plan.leaf_size, None)
        return trees

    def tick_forces(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                    sources: list[tuple[Any, float]], drifted: dict[int, Any], tick: Any,
                    forces: Any, block: list) -> dict[int, list[str]]:
        """Every tile's block tree refit to the tick (:func:`~nbody_dask.tasks.
        drifted_tree`; where every body is synchronised, a run's first evaluation and a
        block's end, trees built afresh: so a resume, which starts there, computes the same
        bits) and a walk per (active tile, source tile), for the active bodies alone
        (:func:`~nbody_dask.tasks.active_tree_pair_forces`)."""
        walk = tasks.Walk(forces, plan.theta, tick.threads)
        trees = [name("btick", j) for j in range(len(sources))]
        synchronised = tick.initial or tick.tick == tick.bins.ticks
        for j, (source, drift) in enumerate(sources):
            if synchronised:  # every tile drifted: trees built afresh, as a resume builds
                dsk[trees[j]] = (tasks.tile_tree, source, plan.leaf_size, None)
            else:
                dsk[trees[j]] = (tasks.drifted_tree, block[j], source, drift)
        parts = {}
        for i, target in drifted.items():
            parts[i] = [name("bwalk", i, j) for j in range(len(sources))]
            for j, tree in enumerate(trees):
                dsk[parts[i][j]] = (tasks.active_tree_pair_forces, target, trees[i], tree,
                                    tick, walk, i == j)
        return parts

    def fallback_start(self, plan: Plan, error: BaseException) -> tuple[int, str] | None:
        step = getattr(error, "step", None)
        if step is None:
            return None
        start = max(r for r in plan.retile_steps() if r <= step)
        return start, (f"walking every tile pair in steps {start + 1}-"
                       f"{plan.window_end(start)}")

    def evaluate(self, ev: Evaluation, dsk: Graph, tiles: list, window: TreeWindow | None):
        """A tree evaluation at ``ev.step`` (re-tiling first at a re-tiling step or without
        a ``window``), yielding pieces where the near/far classification must be fetched."""
        plan, t = ev.plan, len(tiles)
        if not plan.spatial:  # one tile: a tree, its walk and the kick
            yield from ()
            return dsk, _forces(ev, dsk, tiles, _trees(ev, dsk, tiles), None, None), None
        if window is not None and ev.step not in plan.retile_steps():
            trees = [ev.key("tree", i) for i in range(t)]
            for i in range(t):
                dsk[trees[i]] = (tasks.refit_tree, window.trees[i], tiles[i])
            return dsk, _forces(ev, dsk, tiles, trees, window.near, None), window
        tiles = retile(dsk, plan, ev.token, ev.step, tiles)
        trees = _trees(ev, dsk, tiles, cube_key(ev.token, ev.step))
        if not plan.near_far:
            return dsk, _forces(ev, dsk, tiles, trees, None, None), TreeWindow(trees, None)
        # near/far for the positions of this step: fetched before its forces are submitted
        forest = _forest(ev, dsk, trees)
        dsk[ev.key("near")] = (tasks.near_now, forest, plan.theta)
        refs, near = yield from submit(dsk, fetch=ev.key("near"), tiles=tiles, trees=trees,
                                       forest=[forest])
        tiles, trees, (forest,), dsk = refs["tiles"], refs["trees"], refs["forest"], {}
        closed = _forces(ev, dsk, tiles, trees, near, forest)
        last = plan.window_end(ev.step)
        if ev.step in ev.fallback:  # bodies outran this window's margin once: walk every pair
            return dsk, closed, TreeWindow(trees, None)
        if last == ev.step or all(len(row) == t for row in near):
            return dsk, closed, TreeWindow(trees, near)  # (a longer window only adds pairs)
        # near/far until the next re-tiling, from how far the bodies can move from here
        motions = [ev.key("motion", i) for i in range(t)]
        for motion, tile in zip(motions, closed, strict=True):
            dsk[motion] = (tasks.tile_motion, tile)
        dsk[ev.key("nearwindow")] = (tasks.near_in_window, forest, plan.theta,
                                     (last - ev.step) * plan.dt, *motions)
        refs, near = yield from submit(dsk, fetch=ev.key("nearwindow"), tiles=closed,
                                       trees=trees)
        return {}, refs["tiles"], TreeWindow(refs["trees"], near)


def _forces(ev: Evaluation, dsk: Graph, tiles: list, trees: list,
            near: list[list[int]] | None, forest: Any) -> list[str]:
    """The force tasks on ``tiles`` and their ``trees``: a walk per near tile pair (every
    pair when ``near`` is None), one far task per target tile with far sources (from
    ``forest``, added here when None), the closing tasks. A walk uses one thread in the
    ``"pairs"`` layout with several tiles (the worker's threads run many walks), the
    worker's cores otherwise. A target's partials are summed near sources first, in source
    order, then the far task's. With ``"rows"``, one task per target tile does all of that
    (:func:`~nbody_dask.tasks.close_tree_row`)."""
    plan, t = ev.plan, len(tiles)
    threads = 1 if plan.layout == "pairs" and t > 1 else ev.threads
    walk = tasks.Walk(ev.forces, plan.theta, threads)
    near = near or [list(range(t))] * t
    if forest is None and any(len(row) < t for row in near):
        forest = _forest(ev, dsk, trees)
    walked = [set(row) for row in near]
    far = [[j for j in range(t) if j not in walked[i]] for i in range(t)]
    if plan.layout == "rows":
        out = [ev.key("row", i) for i in range(t)]
        for i in range(t):
            dsk[out[i]] = (tasks.close_tree_row, ev.closing, i, walk, plan.split_every,
                           tiles[i], trees[i], near[i], far[i], forest,
                           *[trees[j] for j in near[i]])
        return out
    parts = []
    for i in range(t):
        parts.append([])
        for j in near[i]:
            parts[i].append((ev.key("pair", i, j), None))
            dsk[parts[i][-1][0]] = (tasks.tree_pair_forces, trees[i], trees[j], walk, i == j)
        if far[i]:
            parts[i].append((ev.key("far", i), None))
            dsk[parts[i][-1][0]] = (tasks.far_forces, ev.step, trees[i], forest, far[i], walk)
    return close_targets(ev, dsk, tiles, parts,
                         lambda count: reduction_groups(count, plan.split_every))


def _trees(ev: Evaluation, dsk: Graph, tiles: list, cube: str | None = None) -> list[str]:
    """Add a task building each tile's tree in ``cube`` (the key of a re-tiling's cube;
    None: one tile, in its own); return their keys."""
    trees = [ev.key("tree", i) for i in range(len(tiles))]
    for tree, tile in zip(trees, tiles, strict=True):
        dsk[tree] = (tasks.tile_tree, tile, ev.plan.leaf_size, cube)
    return trees


def _forest(ev: Evaluation, dsk: Graph, trees: list) -> str:
    """Add a summary task per tile tree and the forest of them; return the forest's key."""
    summaries = [ev.key("summary", i) for i in range(len(trees))]
    for summary, tree in zip(summaries, trees, strict=True):
        dsk[summary] = (tasks.tree_summary, tree)
    dsk[ev.key("forest")] = (tasks.tree_forest, *summaries)
    return ev.key("forest")


TREE = register(Tree())
