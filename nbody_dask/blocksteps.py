"""The task graphs of individual time steps: a block of ticks, only the active tiles' work.

With ``timestep="individual"`` (:mod:`nbody_dask.timebins`) a plan step is a block of
``2**(time_bins - 1)`` ticks. At the block's start every tile's opening half-kicks run (one
task a tile). Then, tick by tick, only the ticks where some body's step ends, and at each
only the *active* tiles (those holding such a body) get tasks:

* the tile drifted to the tick (its bodies move in straight lines between their kicks);
  where every body is synchronised (a first evaluation, a block's end) the tree's and
  TreePM's spatial tiles are re-cut from the positions there
  (:meth:`~nbody_dask.methods.ForceMethod.synchronised_tiles`), so that a resume, which
  starts there, cuts the same tiles;
* the force method's tasks (:meth:`~nbody_dask.methods.ForceMethod.tick_forces`), one per
  source tile: the forces on the tile's active bodies due to the source at the tick. Direct
  summation drifts the source inside the task (a source tile that is not active is not
  touched); the tree refits each tile's tree, built at the block's start, to the tick once
  (:meth:`~nbody_dask.methods.ForceMethod.open_block`) and walks the active bodies' leaves
  through it (at the block's end, where a resume starts, it builds the trees afresh, as a
  resume's first evaluation does);
* where every body is synchronised (a first evaluation, a block's end), the method's
  long-range forces (:meth:`~nbody_dask.methods.ForceMethod.tick_long_range`: TreePM's
  mesh), which kick every body by half a block at each end of the block, as GADGET and
  SWIFT step their PM force on the longest step;
* the plan's fixed reduction tree over the sources, in source order, and a closing task:
  the active bodies' closing half-kicks, their new bins, their next opening half-kicks.

So a tick costs ``A (T + 2 + combines)`` tasks for ``A`` active tiles of ``T`` (the tree
adds a refit of every tile's tree): proportional to the active tiles. With
``layout="rows"`` an active tile's force tasks and combines are one task on the worker's
cores (the same bits): ``3 A`` tasks.
Which tiles are active at a tick follows from how many bodies each of their bins holds; bins
change only where a tile is active, so after each tick the builder fetches the new counts of
the tiles it closed (a few integers a tile) and plans the next tick from them: the graph
depends only on data that the same inputs reproduce, so runs stay bit-identical on any
cluster and after a resume.

A one-tile system runs its blocks in one task (:func:`fused_blocks`): the same graphs,
executed in place, without a round trip per tick.

The block's last tick closes every body, with potentials on snapshot steps: snapshots and
resumes happen where every body is synchronised. A run's (or a resume's) first evaluation
is the same tasks with every body active and no kick, so the accelerations and bins a resume
starts from are these of the uninterrupted run. With one bin and the acceleration criterion
a block is exactly a global leapfrog step of the direct method without the symmetric kernel:
the same bits.
"""

from __future__ import annotations

import operator
from collections.abc import Generator, Sequence
from typing import Any

from . import tasks
from .graph import Graph, Piece, closing, combine, key, run_graph, submit
from .plan import Plan, reduction_groups
from .timebins import active_bodies, next_tick, tile_active

__all__ = ["initial_block_pieces", "block_pieces", "tick_graph", "fused_blocks",
           "run_here"]

Counts = list[tuple[int, ...]]


def tick_graph(plan: Plan, token: str, step: int, tick: int, tiles: Sequence,
               last_tick: Sequence[int], counts: Counts, with_potential: bool = False,
               initial: bool = False, threads: int | None = 1, block: Sequence = ()
               ) -> tuple[Graph, list, list[int], str]:
    """The tasks of one tick of block ``step``: the active tiles' drifts, pair forces,
    reductions and closing kicks.

    Parameters
    ----------
    plan : Plan
        An individual-time-step plan.
    token : str
        The run's key token.
    step : int
        The block (plan step).
    tick : int
        The tick, ``1 .. ticks`` (``initial``: 0, the first evaluation).
    tiles : sequence
        Keys or futures of every tile, each at the tick of its last kick, ``last_tick[i]``.
    counts : list of tuple of int
        Bodies per bin of each tile.
    with_potential : bool
        Potentials too (a snapshot step's last tick: every body active).
    initial : bool
        A run's or a resume's first evaluation: every body active, no kick.
    threads : int or None
        Kernel threads of a force task: 1 (the serial kernel) where tasks share a worker's
        threads; None (every core) for a one-tile system's fused blocks.
    block : sequence
        What the force method built at the block's start
        (:meth:`~nbody_dask.methods.ForceMethod.open_block`; none for ``initial``).

    Returns
    -------
    graph : dict
    tiles : list
        The tiles after the tick (new keys for the active ones).
    active : list of int
        The active tiles.
    counts_key : str
        The key of the active tiles' new bin counts (:func:`nbody_dask.tasks.
        tile_bin_counts`).
    """
    bins = plan.bins
    active = [i for i, c in enumerate(counts) if initial or tile_active(c, tick)]
    dsk: Graph = {}

    def name(stage: str, *index: int) -> str:
        return key(token, stage, step, tick, *index)

    factors = plan.block_factors(step, initial)
    ticker = tasks.Tick(tick, bins, initial, step, threads, factors)
    forces = tasks.Forces(plan.softening, with_potential)

    def drift(first: int) -> float:  # the drift factor from tick ``first`` to the tick
        return bins.drift(tick - first) if factors is None else factors.drift_between(first,
                                                                                      tick)

    drifted = {}
    box = plan.box_size if tick == bins.ticks else None  # the state wrapped where it is whole
    for i in active:
        if last_tick[i] == tick:
            drifted[i] = tiles[i]
        else:
            drifted[i] = name("bdrift", i)
            dsk[drifted[i]] = (tasks.drift_tile, tiles[i], drift(last_tick[i]), box)
    if initial or tick == bins.ticks:  # every body synchronised: spatial tiles re-cut
        cut = plan.force_method.synchronised_tiles(plan, dsk, token, step,
                                                   [drifted[i] for i in range(len(tiles))])
        drifted = dict(enumerate(cut))
    sources = [(drifted[j], 0.0) if j in drifted else (tiles[j], drift(last_tick[j]))
               for j in range(len(tiles))]
    partials = plan.force_method.tick_forces(plan, dsk, name, sources, drifted, ticker,
                                             forces, list(block))
    long = plan.force_method.tick_long_range(plan, dsk, name, drifted, ticker, forces)
    closed = closing(plan, step, None, with_potential)
    out = list(tiles)
    for i in active:
        if plan.layout == "rows" and len(tiles) > 1:
            mine = _row(dsk, plan, name("brow", i), partials[i])
        else:
            mine = combine(dsk, [(p, None) for p in partials[i]], plan.groups(),
                           lambda level, g, i=i: name(f"bcombine{level}", i, g))
        out[i] = name("bkick", i)
        dsk[out[i]] = (tasks.close_active, closed, ticker, drifted[i], long.get(i),
                       [s for _, s in mine], *[p for p, _ in mine])
    counts_key = name("bcounts")
    dsk[counts_key] = (tasks.tile_bin_counts, bins.bins, *[out[i] for i in active])
    return dsk, out, active, counts_key


def _row(dsk: Graph, plan: Plan, row: str, partials: list[str]) -> list:
    """The ``"rows"`` layout of a tick: a target tile's tasks of every source (``partials``,
    taken out of ``dsk``) run one after the other in one task, on the worker's cores, and
    their sums by the plan's reduction tree, as the combine tasks would add them (the same
    bits as ``"pairs"``); the parts left for the closing task (tasks within it)."""
    dsk[row] = (tasks.reduce_levels, plan.split_every, *[dsk.pop(p) for p in partials])
    groups = reduction_groups(len(partials), plan.split_every)  # plan.groups(): a part a tile
    left = len(groups[-1]) if groups else len(partials)
    return [((operator.getitem, row, k), None) for k in range(left)]


def _evaluations(counts: Counts, active: list[int], tick: int) -> int:
    """Body force evaluations of a tick."""
    return sum(active_bodies(counts[i], tick) for i in active)


def initial_block_pieces(plan: Plan, token: str, tiles: Sequence, step: int = 0,
                         threads: int | None = None
                         ) -> Generator[Piece, Any, tuple[list, Counts]]:
    """Generator of the :class:`~nbody_dask.graph.Piece` of a run's (or a resume's) first
    evaluation at ``step``: forces, potentials and bins of every body, no kick; returns the
    tiles' futures and their bin counts. ``threads``: the ``"rows"`` layout's kernel
    threads (None: every core)."""
    counts: Counts = [()] * len(tiles)
    dsk, out, _, counts_key = tick_graph(plan, token, step, 0, list(tiles),
                                         [0] * len(tiles), counts, with_potential=True,
                                         initial=True, threads=_threads(plan, threads))
    refs, counts = yield from submit(dsk, fetch=counts_key, tiles=out)
    return refs["tiles"], list(counts)


def block_pieces(plan: Plan, token: str, tiles: Sequence, counts: Counts, first: int,
                 last: int, potential_steps: frozenset, threads: int | None = None
                 ) -> Generator[Piece, Any, tuple[list, Counts, int]]:
    """Generator of the :class:`~nbody_dask.graph.Piece` s of blocks ``first..last`` from
    ``tiles`` (futures of the state after block ``first - 1``, every body synchronised) and
    their bin counts; returns the tiles' futures after block ``last``, their bin counts, and
    the body force evaluations the blocks took. Potentials are computed at the end of
    ``potential_steps`` (snapshot steps). ``threads``: the ``"rows"`` layout's kernel
    threads (None: every core)."""
    bins, tiles, evaluations = plan.bins, list(tiles), 0
    for step in range(first, last + 1):
        dsk: Graph = {}
        for i, tile in enumerate(tiles):
            tiles[i] = key(token, "bopen", step, i)
            dsk[tiles[i]] = (tasks.open_tile_block, tile, bins, plan.block_factors(step))
        block = plan.force_method.open_block(
            plan, dsk, lambda stage, *index, step=step: key(token, stage, step, *index), tiles)
        last_tick, tick = [0] * len(tiles), 0
        while tick < bins.ticks:
            tick = next_tick(counts, tick)
            graph, tiles, active, counts_key = tick_graph(
                plan, token, step, tick, tiles, last_tick, counts,
                with_potential=tick == bins.ticks and step in potential_steps,
                threads=_threads(plan, threads), block=block)
            dsk.update(graph)
            evaluations += _evaluations(counts, active, tick)
            refs, new = yield from submit(dsk, fetch=counts_key, tiles=tiles, block=block)
            tiles, block, dsk = refs["tiles"], refs["block"], {}
            for i, c in zip(active, new, strict=True):
                counts[i], last_tick[i] = c, tick
    return tiles, counts, evaluations


def _threads(plan: Plan, rows_threads: int | None) -> int | None:
    """A force task's kernel threads: every core for one tile (its blocks run in one task),
    ``rows_threads`` for the ``"rows"`` layout (a task a target tile), else one (the tasks
    share the workers' threads)."""
    if plan.n_tiles == 1:
        return None
    return rows_threads if plan.layout == "rows" else 1


def fused_blocks(tile: Any, counts: Counts, plan: Plan, token: str, first: int, last: int,
                 potential_steps: frozenset) -> tuple[Any, tuple[Counts, int]]:
    """Blocks ``first..last`` of a one-tile system in one task, exactly as the task graphs
    of :func:`block_pieces`: the tile after them, and its bin counts and the evaluations."""
    tiles, counts, evaluations = run_here(block_pieces(plan, token, [tile], counts, first,
                                                       last, potential_steps))
    return tiles[0], (counts, evaluations)


def run_here(pieces: Generator[Piece, Any, Any]) -> Any:
    """Run a graph built in pieces in this thread, each piece's tasks in insertion order
    (dependencies come first), as :func:`nbody_dask.driver.submit_pieces` runs it on a
    cluster; return the generator's result."""
    reply = None
    while True:
        try:
            piece = pieces.send(reply)
        except StopIteration as done:
            return done.value
        values = run_graph(piece.graph, {})  # what it needs of earlier pieces: references
        refs = {group: [values[k] if isinstance(k, str) else k for k in keys]
                for group, keys in piece.keep.items()}
        reply = refs, None if piece.fetch is None else values[piece.fetch]
