"""A run's task graphs, built from its :class:`~nbody_dask.plan.Plan` as plain dicts.

A graph is a ``dict`` from key to task, a task being a tuple ``(function, *arguments)`` of a
function of :mod:`nbody_dask.tasks` whose arguments may name other keys of the graph or be
:class:`distributed.Future` objects of an earlier submission (Dask's low-level graph format;
the client ships it without walking objects, so building and submitting a task costs
microseconds). Keys are deterministic: ``nbody-<stage>-<token>-<step>-<i>[-<j>]``, where
``token`` identifies the run.

A step is ``T`` drift tasks (the opening half-kick and drift of each tile) followed by the
tasks that the run's force method (:mod:`nbody_dask.methods`) adds for one force
evaluation: whatever gives each target tile its partial forces, then, per target tile, the
combine tasks of a fixed reduction tree (:func:`combine`) and the closing task that sums
the last partials, multiplies by G and kicks (:func:`close_targets`). Partials of a target
tile are always summed in a fixed order within fixed groups, so the result does not depend
on the number of workers, the scheduling order or retries: runs are bit-reproducible.

A method may need to look at data before it can build the rest of a step (the tree's
near/far classification), so graphs are built in pieces: :func:`initial_pieces` and
:func:`steps_pieces` are generators of :class:`Piece`, which the driver submits one by one,
sending back the futures and the value each asks for. Plans whose tiles stay in body order
can also be built whole (:func:`initial_graph`, :func:`steps_graph`), and :func:`execute`
runs a graph in place, in its insertion order: a one-tile system runs many steps as one
task that way (:func:`fused_steps`), with exactly the operations of the tasks.

Snapshots (:func:`snapshot_graph`) route tiles back to body order when the method moved
bodies between tiles (:func:`body_order`), write each tile's region from its worker, and
reduce the diagnostics in fixed order.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask import delayed

from . import tasks
from .accuracy import join_targets, pick_targets, reference_partial, sample_targets, \
    sampled_errors
from .bodies import make_tile
from .integrators import canonical, open_step
from .location import StoreLocation
from .plan import Plan, tile_bounds
from .spatial import (bounding_cube, cut_by_chunk, cut_by_splitters, key_sample, merge_by_id,
                      merge_parts, sample_stride, splitters, tile_boxes)

__all__ = ["Graph", "Piece", "Evaluation", "key", "submit", "combine", "close_targets",
           "move_bodies", "body_order", "closing", "cube_key", "retile", "reduce_in_order",
           "initial_pieces", "steps_pieces", "initial_graph",
           "steps_graph", "fused_steps", "snapshot_graph", "execute", "run_graph",
           "lazy_tiles"]

Graph = dict[str, tuple]

#: A partial force on a target tile: the key of its task, and which side of a symmetric
#: pair task's :class:`~nbody_dask.tasks.PairForces` (None: the task's one result).
Part = tuple[str, int | None]


def key(token: str, stage: str, step: int, *index: int) -> str:
    """The key of a task: ``nbody-<stage>-<token>-<step>-<i>[-<j>]``."""
    return "-".join(["nbody", stage, token, str(step), *map(str, index)])


@dataclass(frozen=True)
class Piece:
    """A piece of a graph built in parts: the driver submits :attr:`graph` and sends back,
    for each named group of :attr:`keep` (keys of the graph, or futures passed through),
    their futures, and the value of the task :attr:`fetch` (when not None)."""

    graph: Graph
    keep: dict[str, list]
    fetch: str | None = None


def submit(dsk: Graph, fetch: str | None = None, **keep: list
           ) -> Generator[Piece, Any, tuple[dict[str, list], Any]]:
    """Yield a :class:`Piece`; return the driver's reply: the futures of each group of
    ``keep``, by name, and the fetched value (None when ``fetch`` is None)."""
    return (yield Piece(dsk, keep, fetch))


@dataclass(frozen=True)
class Evaluation:
    """One force evaluation that a method adds to a graph: at ``step`` of a run (``token``),
    with the potential or not, followed by a closing kick of factor ``kick`` (None: the
    initial evaluation, no kick), on ``threads`` kernel threads per task where a task runs a
    parallel kernel (None: every core), with the method's fallback in force in the stretches
    that start at the steps of ``fallback``."""

    plan: Plan
    token: str
    step: int
    with_potential: bool
    kick: float | None
    threads: int | None = None
    fallback: frozenset[int] = field(default_factory=frozenset)

    def key(self, stage: str, *index: int) -> str:
        """The key of a task of this evaluation."""
        return key(self.token, stage, self.step, *index)

    @property
    def forces(self) -> tasks.Forces:
        return tasks.Forces(self.plan.softening, self.with_potential)

    @property
    def closing(self) -> tasks.Closing:
        return closing(self.plan, self.step, self.kick, self.with_potential)


def closing(plan: Plan, step: int, kick: float | None, snapshot: bool) -> tasks.Closing:
    """What the closing tasks of ``step`` do (:class:`~nbody_dask.tasks.Closing`): kick by
    ``kick``, and at a ``snapshot`` step round a comoving run's momenta as a resume would
    read them back."""
    scale = plan.scale_factor(step) if plan.comoving and snapshot else None
    return tasks.Closing(step, plan.G, kick, scale)


def combine(dsk: Graph, parts: list[Part], groups: list, name: Callable[[int, int], str]
            ) -> list[Part]:
    """Add the combine tasks of the reduction tree ``groups`` over ``parts``, task ``g`` of
    level ``l`` keyed ``name(l, g)``; return the at most ``split_every`` parts left for the
    consumer to add."""
    for level, ranges in enumerate(groups):
        combined = []
        for g, (lo, hi) in enumerate(ranges):
            combined.append((name(level, g), None))
            dsk[combined[-1][0]] = (tasks.sum_sides, [s for _, s in parts[lo:hi]],
                                    *[p for p, _ in parts[lo:hi]])
        parts = combined
    return parts


def close_targets(ev: Evaluation, dsk: Graph, tiles: Sequence, parts: list[list[Part]],
                  groups: Callable[[int], list]) -> list[str]:
    """Add, for every target tile ``i``, the combine tasks of its partials ``parts[i]`` (in
    the order given) with the reduction tree ``groups(len(parts[i]))``, and the closing task
    (:func:`~nbody_dask.tasks.close`); return the closed tiles' keys."""
    out = []
    for i, mine in enumerate(parts):
        mine = combine(dsk, mine, groups(len(mine)),
                       lambda level, g, i=i: ev.key(f"combine{level}", i, g))
        out.append(ev.key("kick", i))
        dsk[out[-1]] = (tasks.close, ev.closing, tiles[i], [s for _, s in mine],
                        *[p for p, _ in mine])
    return out


def move_bodies(dsk: Graph, plan: Plan, token: str, stage: str, step: int, cuts: Sequence,
                merge: Callable, heads: list[list]) -> list[str]:
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
            dsk[out[-1]] = (tasks.merge_picked, new - lo, merge, heads[new], *blocks)
    return out


def body_order(dsk: Graph, plan: Plan, token: str, step: int, tiles: Sequence) -> list[str]:
    """Add the tasks that route ``tiles`` back to body order, in the plan's tile bounds (the
    store's chunks), when the method moved bodies between tiles; return their keys (else
    ``tiles``)."""
    if not plan.force_method.reorders(plan):
        return list(tiles)
    bounds = plan.tile_bounds()
    cuts = [key(token, "bycut", step, i) for i in range(len(tiles))]
    for i, tile in enumerate(tiles):
        dsk[cuts[i]] = (cut_by_chunk, tile, plan.tile_size, len(bounds))
    return move_bodies(dsk, plan, token, "bodyorder", step, cuts, merge_by_id,
                       [[lo] for lo, _ in bounds])


def cube_key(token: str, step: int) -> str:
    """The key of the re-tiling's cube at ``step``: the Morton curve's and the trees'."""
    return key(token, "cube", step)


def retile(dsk: Graph, plan: Plan, token: str, step: int, tiles: list) -> list[str]:
    """Add the tasks that re-cut ``tiles`` into spatial tiles along the Morton curve
    (:mod:`nbody_dask.spatial`); return the keys of the new tiles.

    ``T`` extents, one cube, ``T`` key samples, one splitter task, ``T`` cuts, ``T x B``
    parts (:meth:`~nbody_dask.plan.Plan.shuffle_blocks`) and ``T`` merges: no task holds
    more than one block of tiles' bodies.
    """
    t = len(tiles)
    extents = [key(token, "extent", step, i) for i in range(t)]
    samples = [key(token, "sample", step, i) for i in range(t)]
    cuts = [key(token, "cut", step, i) for i in range(t)]
    cube, split = cube_key(token, step), key(token, "splitters", step)
    stride = sample_stride(plan.n, t)
    for i, tile in enumerate(tiles):
        dsk[extents[i]] = (tile_boxes, tile)
    dsk[cube] = (bounding_cube, *extents)
    for i, tile in enumerate(tiles):
        dsk[samples[i]] = (key_sample, tile, cube, stride)
    dsk[split] = (splitters, t, *samples)
    for i, tile in enumerate(tiles):
        dsk[cuts[i]] = (cut_by_splitters, tile, cube, split)
    return move_bodies(dsk, plan, token, "spatial", step, cuts, merge_parts, [[]] * t)


def reduce_in_order(dsk: Graph, parts: list, groups: list, name: Callable[[int, int], str],
                    function: Callable, *args: Any) -> list:
    """Add the tasks of the fixed reduction tree ``groups`` over ``parts`` (keys), each
    ``function(*args, *its_parts)``, task ``g`` of level ``l`` keyed ``name(l, g)``; return
    the at most ``split_every`` parts left for the consumer (which must add them in order,
    with the same ``function``)."""
    for level, ranges in enumerate(groups):
        below, parts = parts, [name(level, g) for g in range(len(ranges))]
        for g, (lo, hi) in enumerate(ranges):
            dsk[parts[g]] = (function, *args, *below[lo:hi])
    return parts


def _finish(dsk: Graph, tiles: list, state: Any):
    """Submit what is left of ``dsk`` (if anything); return the tiles' futures and the
    method's state with its references' futures."""
    if not dsk:
        return tiles, state
    refs, _ = yield from submit(dsk, tiles=tiles,
                                state=[] if state is None else state.references())
    return refs["tiles"], None if state is None else state.rebound(refs["state"])


def initial_pieces(plan: Plan, token: str, tiles: Sequence, with_potential: bool = True,
                   threads: int | None = None, step: int = 0,
                   fallback: frozenset = frozenset()):
    """Generator of the :class:`Piece` s that attach forces (and potentials) to the initial
    ``tiles`` (at ``step``: 0, or a resumed snapshot's step; no kick); returns the futures
    of the closed tiles and the method's state (see :mod:`nbody_dask.methods`).
    ``fallback``: the stretches (by first step) where the method's fallback is in force."""
    ev = Evaluation(plan, token, step, with_potential, None, threads, fallback)
    dsk, tiles, state = yield from plan.force_method.evaluate(ev, {}, list(tiles), None)
    return (yield from _finish(dsk, tiles, state))


def steps_pieces(plan: Plan, token: str, tiles: Sequence, state: Any, first: int, last: int,
                 potential_steps: frozenset, threads: int | None = None,
                 fallback: frozenset = frozenset()):
    """Generator of the :class:`Piece` s of steps ``first..last`` from ``tiles`` (futures of
    the state after step ``first - 1``) and the method's state of that step; returns the
    futures of the tiles after step ``last`` and the method's new state. Potentials are
    computed on ``potential_steps`` (snapshot steps)."""
    method, dsk = plan.force_method, {}
    for step in range(first, last + 1):
        drifted = [key(token, "drift", step, i) for i in range(len(tiles))]
        kick, drift, close = plan.step_factors(step)
        for name, tile in zip(drifted, tiles, strict=True):
            dsk[name] = (open_step, tile, kick, drift, plan.box_size)
        ev = Evaluation(plan, token, step, step in potential_steps, close, threads,
                        fallback)
        dsk, tiles, state = yield from method.evaluate(ev, dsk, drifted, state)
    return (yield from _finish(dsk, tiles, state))


def _whole(plan: Plan, pieces: Generator) -> tuple[Graph, list[str]]:
    """The one graph of a plan whose method builds it without looking at data."""
    if plan.force_method.reorders(plan):
        raise ValueError("a plan whose tiles leave body order is built in pieces: see "
                         "initial_pieces and steps_pieces")
    try:
        piece = next(pieces)
    except StopIteration as done:  # no step: nothing to submit
        return {}, list(done.value[0])
    if piece.fetch is not None:
        raise ValueError("this plan's graph depends on data: see initial_pieces and "
                         "steps_pieces")
    return piece.graph, list(piece.keep["tiles"])


def initial_graph(plan: Plan, token: str, tiles: Sequence, with_potential: bool = True,
                  threads: int | None = None) -> tuple[Graph, list[str]]:
    """Attach forces (and potentials) to the initial ``tiles``: step 0, no kick (plans whose
    tiles stay in body order; see :func:`initial_pieces`)."""
    return _whole(plan, initial_pieces(plan, token, tiles, with_potential, threads))


def steps_graph(plan: Plan, token: str, tiles: Sequence, first: int, last: int,
                potential_steps: frozenset, threads: int | None = None
                ) -> tuple[Graph, list[str]]:
    """Leapfrog steps ``first..last`` from ``tiles`` (the state after step ``first - 1``),
    for plans whose tiles stay in body order (see :func:`steps_pieces`); returns the graph
    and the keys of the tiles after step ``last``."""
    return _whole(plan, steps_pieces(plan, token, tiles, None, first, last, potential_steps,
                                     threads))


def fused_steps(tile: Any, plan: Plan, token: str, first: int, last: int,
                potential_steps: frozenset, threads: int | None = None) -> Any:
    """Steps ``first..last`` of a one-tile system in one task, exactly as the task graph."""
    dsk, (out,) = steps_graph(plan, token, ["input"], first, last, potential_steps, threads)
    return execute(dsk, out, {"input": tile})


def snapshot_graph(plan: Plan, token: str, tiles: Sequence, step: int,
                   path: StoreLocation | None, index: int, writer: str = ""
                   ) -> tuple[Graph, str]:
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
        dsk[name] = (tasks.write_and_measure, path, index, tile, plan.G, token, writer,
                     plan.scale_factor(step) if plan.comoving else None)
    parts = combine(dsk, parts, plan.groups(),
                    lambda level, g: key(token, f"diagcombine{level}", step, g))
    total = key(token, "diagnostics", step)
    dsk[total] = (tasks.sum_in_order, *[p for p, _ in parts])
    if plan.force_error_sample:
        errors = _sampled_force_errors(dsk, plan, token, step, tiles)
        dsk[key(token, "diagerrors", step)] = (tasks.append, total, errors)
        total = key(token, "diagerrors", step)
    return dsk, total


def _sampled_force_errors(dsk: Graph, plan: Plan, token: str, step: int,
                          tiles: Sequence) -> str:
    """Add the tasks that measure the force errors of the plan's sampled bodies in body-order
    ``tiles`` against a float64 direct sum, the Ewald sum in a periodic box (each tile adds
    its part, summed in tile order); return the key of their ``[median, p99, max]``."""
    name = functools.partial(key, token)
    targets = _error_targets(plan.n, plan.force_error_sample)
    picks = [name("errpick", step, i) for i in range(len(tiles))]
    for pick, tile in zip(picks, tiles, strict=True):
        dsk[pick] = (pick_targets, tile, targets)
    joined = name("errtargets", step)
    dsk[joined] = (join_targets, *picks)
    partials = [name("errpart", step, i) for i in range(len(tiles))]
    for part, tile in zip(partials, tiles, strict=True):
        dsk[part] = (reference_partial, joined, tile, plan.softening, plan.box_size)
    dsk[name("errref", step)] = (tasks.sum_in_order, *partials)
    dsk[name("errstats", step)] = (sampled_errors, joined, plan.G, name("errref", step))
    return name("errstats", step)


@functools.lru_cache(maxsize=4)
def _error_targets(n: int, sample: int) -> np.ndarray:
    """The bodies whose force errors every snapshot of a run records (always the same)."""
    return sample_targets(n, sample, seed=0)


def execute(dsk: Graph, out: str, inputs: dict[str, Any]) -> Any:
    """Run a graph in this thread, in insertion order (dependencies come first)."""
    return run_graph(dsk, inputs)[out]


def run_graph(dsk: Graph, inputs: dict[str, Any]) -> dict[str, Any]:
    """Run a graph in this thread, in insertion order, from the values of ``inputs`` (keys
    its tasks name that it does not hold); return every task's value and the inputs."""
    values = dict(inputs)

    def resolve(arg: Any) -> Any:
        return values[arg] if isinstance(arg, str) and arg in values else arg

    for name, (func, *args) in dsk.items():
        values[name] = func(*map(resolve, args))
    return values


def lazy_tiles(bodies: Any, tile_size: int, dtype: type[np.floating],
               scale: float | None = None) -> list:
    """Delayed tiles of a lazy body set (:func:`~nbody_dask.bodies.is_lazy`), each built by
    a worker from its rows of the set's Dask arrays (:func:`~nbody_dask.bodies.make_tile`),
    with canonical momenta for a comoving run at scale factor ``scale``: the bodies never
    pass through the driver. The same tiles as :func:`~nbody_dask.bodies.split_tiles`."""
    position, velocity, mass = (bodies[name].data for name in ("position", "velocity", "mass"))
    tiles = []
    for lo, hi in tile_bounds(position.shape[0], tile_size):
        tile = delayed(make_tile, pure=True)(lo, position[lo:hi], velocity[lo:hi],
                                             mass[lo:hi], dtype)
        tiles.append(tile if scale is None else delayed(canonical, pure=True)(tile, scale))
    return tiles

